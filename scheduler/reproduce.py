"""Reproductions of the seed papers' published comparisons in the simulator (docs/sharing.md).

    python -m scheduler.reproduce sharing001 [--seeds 20] [--out DIR]
    python -m scheduler.reproduce kscheduler003 [--out DIR]
    python -m scheduler.reproduce elastic002 [--out DIR]    (docs/elastic.md)
    python -m scheduler.reproduce elastic002_cluster [--seeds 5] [--out DIR]    (docs/elastic.md)
    python -m scheduler.reproduce slowdown000 [--out DIR]
    python -m scheduler.reproduce reserve [--out DIR]    (docs/policies.md, "Reservations")
    python -m scheduler.reproduce peers [--seeds N] [--traces ...] [--quick] [--out FILE.csv]
        (docs/policies.md, "Peers"; ``scheduler.peers`` has the options)

**sharing001** (paper 001, ALGORITHMS §4): the scenario's 180 apps under ``sharing_mode``,
``sharing_random`` and ``byscale``, once per seed 0..N-1. A seed shuffles the order the apps
are queued in (they all arrive at t = 0) and seeds the simulator's random generator (the
random policy's draws, and its GPU binding in the *bound* reading). The metric is the paper's
total execution time (the makespan); the table gives mean, standard deviation, min and max over
the seeds, and the mean of the per-seed ratios to ``sharing_mode``. Two readings of the
policies are run:

- *work-conserving*: ``sharing_mode`` falls back to another mode when its preferred GPUs are
  full, ``sharing_random`` draws among the GPUs that can take the job now, ``byscale`` keeps its
  mapping (big -> time-slicing, medium -> MPS, small -> MIG);
- *bound*: every policy waits for its choice: ``sharing_mode`` without fallback,
  ``sharing_random`` bound to one random GPU per job (a pod sent to a random node), ``byscale``
  as above.

**kscheduler003** (thesis 003 ch. IV, ALGORITHMS §3): workloads W1-W9 (``scheduler.kernels``)
on the scenario's Titan Xp under ``kscheduler``, ``warped_slicer`` and ``even_partition``.
Per workload: weighted speedup (sum of solo times / the workload's makespan), ANTT and
fairness. The thesis' ANTT averages each kernel's co-run time over its solo time (kernels of a
later group are not charged the wait for the earlier ones: its K-Scheduler ANTT of 1.31 with
groups run one after another allows no other reading), which is our ``avg_slowdown``;
fairness is min / max of solo / co-run time. The turnaround-based ANTT (queueing included) is
printed too.

**elastic002_cluster** (paper 002, ALGORITHMS §6; docs/elastic.md): Poisson streams of elastic
Gavel jobs on 2 and 4 nodes of 4 V100 in the cluster simulator, ``elastic`` against ``fifo`` at
1, 2 and 4 GPUs per job, per seed 0..N-1 (``--seeds``, default 5 here): jobs completed ("N of
M"), average JCT, makespan and GPU-hours (means over the seeds).

**slowdown000** (paper 000, ALGORITHMS §5; docs/slowdown.md): sets (a), (b), (c)
(``slowdown000``, ``slowdown000b``, ``slowdown000c``) in the data-parallel simulator
(``scheduler.simulator.dataparallel``) with static placements (``loadbalance``, no ratio
changes) and with ``slowdown_dr``: SD_max_diff at the start and settled, the mean SD, the mean
GPU utilisation (over the time all jobs run together), and the jobs' final Slow-Downs, beside
the paper's figures. With ``--out``, ``runs.csv`` holds the SD samples over time.

**reserve** (``scheduler.scenarios.reservations``): the framework's EASY reservations
(``reserve``) off and on, for the backfilling framework policies, on ``philly_multigpu`` and a
kept-aside trace generated with the same settings and seed 1.

Progress goes to stderr; results are printed as tables and, with ``--out``, written as CSV.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints

from scheduler.domain import JobSpec
from scheduler.interference import build_interference
from scheduler.metrics import antt, completed, fairness, slowdown_stats
from scheduler.policies.registry import build_policy
from scheduler.simulator import simulate

SHARING_POLICIES = ("sharing_mode", "sharing_random", "byscale")
SHARING_READINGS: Mapping[str, Mapping[str, Mapping[str, Any]]] = {
    "work-conserving": {"sharing_mode": {"fallback": True}, "sharing_random": {"bind": False}},
    "bound": {"sharing_mode": {"fallback": False}, "sharing_random": {"bind": True}},
}
PAPER_001 = {"sharing_random": 3.1, "byscale": 5.0}  # total time / sharing_mode's
KSCHEDULER_POLICIES = ("kscheduler", "warped_slicer", "even_partition")
SLOWDOWN_SETS = {"a": "slowdown000", "b": "slowdown000b", "c": "slowdown000c"}
#: Paper 000's figures per set: SD_max_diff without / with the method, mean SD change, mean
#: GPU utilisation change (ALGORITHMS.md §5).
PAPER_000 = {
    "a": {"sd_max_diff_static": 0.65, "sd_max_diff_dr": 0.1, "mean_sd_change": -0.15,
          "util_change": 0.40},
    "b": {"sd_max_diff_static": 0.65, "sd_max_diff_dr": 0.3, "mean_sd_change": -0.20,
          "util_change": 0.25},
    "c": {"sd_max_diff_static": 0.65, "sd_max_diff_dr": 0.1, "mean_sd_change": -0.15,
          "util_change": 0.15},
}  # fmt: skip


def shuffled(jobs: Sequence[JobSpec], seed: int) -> list[JobSpec]:
    """The jobs in a queue order drawn from ``seed`` (seed 0: the scenario's own order)."""
    out = list(jobs)
    if seed:
        random.Random(seed).shuffle(out)
    return out


def run_sharing001(
    seeds: int = 20,
    progress: Callable[[str], None] | None = None,
    scenario: str = "sharing001",
) -> pd.DataFrame:
    """One row per (reading, policy, seed): makespan and completion counts. ``scenario``: the
    built-in one, or the path of a variant (another profiles file, cluster...)."""
    from scheduler.scenarios import load_scenario

    sc = load_scenario(scenario)
    model = build_interference(sc.interference)
    rows = []
    runs = len(SHARING_READINGS) * len(SHARING_POLICIES) * seeds
    n = 0
    for reading, overrides in SHARING_READINGS.items():
        for seed in range(seeds):
            jobs = shuffled(sc.jobs, seed)
            config = dataclasses.replace(sc.config, seed=seed)
            for name in SHARING_POLICIES:
                params = {**sc.policy_params.get(name, {}), **overrides.get(name, {})}
                if name == "sharing_random":
                    params["bind_seed"] = seed
                result = simulate(
                    sc.cluster, jobs, build_policy(name, params), interference=model, config=config
                )
                frame = result.jobs_frame()
                done = completed(frame)
                rows.append(
                    {
                        "reading": reading,
                        "policy": name,
                        "seed": seed,
                        "jobs": len(frame),
                        "completed": len(done),
                        "makespan_s": float(done["finish_s"].max() - done["arrival_s"].min()),
                        "avg_jct_s": float(done["jct_s"].mean()),
                    }
                )
                n += 1
                if progress is not None:
                    progress(f"sharing001: {n}/{runs} runs ({reading}, {name}, seed {seed})")
    return pd.DataFrame(rows)


def summarize_sharing001(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean, spread and ratio to ``sharing_mode`` per (reading, policy)."""
    out = []
    for (reading, policy), g in runs.groupby(["reading", "policy"], sort=False):
        base = runs[(runs.reading == reading) & (runs.policy == "sharing_mode")].set_index("seed")
        ratios = [m / base.loc[s, "makespan_s"] for s, m in zip(g.seed, g.makespan_s, strict=True)]
        out.append(
            {
                "reading": reading,
                "policy": policy,
                "seeds": len(g),
                "all_completed": bool((g.completed == g.jobs).all()),
                "makespan_mean_s": g.makespan_s.mean(),
                "makespan_std_s": g.makespan_s.std(ddof=1) if len(g) > 1 else 0.0,
                "makespan_min_s": g.makespan_s.min(),
                "makespan_max_s": g.makespan_s.max(),
                "ratio_to_sharing_mode": statistics.fmean(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "paper_ratio": PAPER_001.get(policy, 1.0),
            }
        )
    return pd.DataFrame(out)


def workload_jobs(name: str, profiles: Mapping[str, Any]) -> list[JobSpec]:
    """Jobs of kernel workload ``name`` (``scheduler.kernels.WORKLOADS``), all at t = 0."""
    from scheduler.kernels import WORKLOADS

    return [
        JobSpec(id=f"{k:02d}-{app}", name=app, kind=profiles[app].kind, profile=profiles[app])
        for k, app in enumerate(WORKLOADS[name])
    ]


def run_kscheduler003(progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """One row per (workload, policy) with the thesis' three metrics."""
    from scheduler.kernels import WORKLOADS
    from scheduler.scenarios import SCENARIO_DIR, load_scenario
    from scheduler.traces import load_profiles

    sc = load_scenario("kscheduler003")
    profiles = load_profiles(SCENARIO_DIR / "profiles" / "kscheduler003.yaml")
    model = build_interference(sc.interference)
    rows = []
    for w in WORKLOADS:
        jobs = workload_jobs(w, profiles)
        for name in KSCHEDULER_POLICIES:
            policy = build_policy(name, sc.policy_params.get(name, {}))
            result = simulate(sc.cluster, jobs, policy, interference=model, config=sc.config)
            frame = result.jobs_frame()
            done = completed(frame)
            span = float(done["finish_s"].max() - done["arrival_s"].min())
            rows.append(
                {
                    "workload": w,
                    "policy": name,
                    "completed": len(done),
                    "jobs": len(frame),
                    "weighted_speedup": float(done["solo_s"].sum()) / span,
                    "antt_corun": slowdown_stats(frame)[0],
                    "antt_turnaround": antt(frame),
                    "fairness": fairness(frame),
                    "makespan_ms": 1000.0 * span,
                }
            )
            if progress is not None:
                progress(f"kscheduler003: {w} {name}")
    return pd.DataFrame(rows)


def summarize_kscheduler003(runs: pd.DataFrame) -> pd.DataFrame:
    """Means over the workloads, beside the thesis."""
    from scheduler.kernels import THESIS_RESULTS

    out = []
    for policy, g in runs.groupby("policy", sort=False):
        ws, an, fa = THESIS_RESULTS[policy]
        out.append(
            {
                "policy": policy,
                "workloads": len(g),
                "all_completed": bool((g.completed == g.jobs).all()),
                "weighted_speedup": g.weighted_speedup.mean(),
                "thesis_weighted_speedup": ws,
                "antt": g.antt_corun.mean(),
                "thesis_antt": an,
                "fairness": g.fairness.mean(),
                "thesis_fairness": fa,
                "antt_turnaround": g.antt_turnaround.mean(),
            }
        )
    return pd.DataFrame(out)


def run_slowdown000(
    progress: Callable[[str], None] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary: one row per set and policy; samples: SD and utilisation over time)."""
    from scheduler.scenarios import load_scenario
    from scheduler.simulator.dataparallel import DpConfig, simulate_data_parallel

    rows = []
    frames = []
    for key, name in SLOWDOWN_SETS.items():
        sc = load_scenario(name)
        model = build_interference(sc.interference)
        config = DpConfig(
            seed=sc.config.seed, context_switch_overhead=sc.config.context_switch_overhead
        )
        for policy_name in ("loadbalance", "slowdown_dr"):
            policy = build_policy(policy_name, sc.policy_params.get(policy_name, {}))
            result = simulate_data_parallel(
                sc.cluster, sc.jobs, policy, interference=model, config=config
            )
            s = result.summary()
            rows.append(
                {
                    "set": key,
                    "policy": policy_name,
                    "completed": result.completed,
                    "sd_max_diff_start": s["start_sd_max_diff"],
                    "sd_max_diff_settled": s["settled_sd_max_diff"],
                    "mean_sd": s["full_mean_sd"],
                    "util_pct": s["full_util_pct"],
                    "job_sd_mean": s["mean_job_sd"],
                    "job_sd_max": s["max_job_sd"],
                    "makespan_s": s["makespan_s"],
                    "ratio_changes": int(s["ratio_changes"]),
                }
            )
            frame = result.samples_frame()
            frame.insert(0, "set", key)
            frames.append(frame)
            if progress is not None:
                progress(f"slowdown000: set {key} {policy_name}")
    summary = pd.DataFrame(rows)
    for key, paper in PAPER_000.items():
        static = summary[(summary.set == key) & (summary.policy == "loadbalance")].iloc[0]
        dr = (summary.set == key) & (summary.policy == "slowdown_dr")
        summary.loc[dr, "mean_sd_change"] = summary.loc[dr, "mean_sd"] / static.mean_sd - 1
        summary.loc[dr, "util_change"] = summary.loc[dr, "util_pct"] / static.util_pct - 1
        for k, v in paper.items():
            summary.loc[summary.set == key, f"paper_{k}"] = v
    return summary, pd.concat(frames, ignore_index=True)


def _progress(enabled: bool) -> Callable[[str], None] | None:
    if not enabled:
        return None

    def say(text: str) -> None:
        print(f"\r{text:<78}", end="", file=sys.stderr, flush=True)

    return say


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["peers"]:
        from scheduler.peers import main as peers_main

        return peers_main(args_list[1:])
    parser = argparse.ArgumentParser(
        prog="python -m scheduler.reproduce", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "name",
        choices=[
            "sharing001",
            "kscheduler003",
            "slowdown000",
            "elastic002",
            "elastic002_cluster",
            "reserve",
            "peers",
        ],
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="sharing001: seeds (default 20); elastic002_cluster: seeds (default 5)",
    )
    parser.add_argument(
        "--scenario", help="sharing001: a variant scenario YAML instead of the built-in one"
    )
    parser.add_argument("--out", help="directory for runs.csv and summary.csv")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(args_list)
    if args.seeds is not None and args.seeds < 1:
        parser.error("--seeds must be >= 1")
    say = _progress(not args.quiet and sys.stderr.isatty())
    if args.name == "elastic002":
        from scheduler.scenarios.elastic002 import run_elastic002, summarize_elastic002

        runs = run_elastic002(progress=say)
        summary = summarize_elastic002(runs)
    elif args.name == "elastic002_cluster":
        from scheduler.scenarios.elastic002_cluster import (
            run_elastic002_cluster,
            summarize_elastic002_cluster,
        )

        runs = run_elastic002_cluster(seeds=args.seeds or 5, progress=say)
        summary = summarize_elastic002_cluster(runs)
    elif args.name == "sharing001":
        runs = run_sharing001(
            args.seeds or 20, progress=say, scenario=args.scenario or "sharing001"
        )
        summary = summarize_sharing001(runs)
    elif args.name == "reserve":
        from scheduler.scenarios.reservations import run_reservations, summarize_reservations

        runs = run_reservations(progress=say)
        summary = summarize_reservations(runs)
    elif args.name == "slowdown000":
        summary, runs = run_slowdown000(progress=say)
    else:
        runs = run_kscheduler003(progress=say)
        summary = summarize_kscheduler003(runs)
    if say is not None:
        print(file=sys.stderr)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        if args.name == "kscheduler003":
            print(runs.round(3).to_string(index=False))
            print()
        print(summary.round(3).to_string(index=False))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        runs.to_csv(out / "runs.csv", index=False)
        summary.to_csv(out / "summary.csv", index=False)
        print(f"wrote {out / 'runs.csv'}, {out / 'summary.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
