"""Our policies against the peers in the same engine (docs/policies.md, "Peers").

    python -m scheduler.reproduce peers [--seeds N] [--traces light contended ...] [--quick]
        [--policies P ...] [--noise 0.5] [--pair-noise 0.3] [--round-s 360] [--restart-s 60]
        [--hide-lengths SHARE] [--set POLICY.PARAM=VALUE ...] [--out FILE.csv]

Every policy runs on the same traces, cluster and settings, once per seed ``0..N-1``:

- **Traces** (``TRACES``): ``philly`` (Gavel's 951-job Philly trace on its 36-GPU cluster,
  scenario ``philly_gavel``), ``light`` / ``contended`` / ``burst`` (100 generated single-GPU
  jobs of 1-4 h on 4 V100 + 4 P100 + 4 K80: one arrival per 1,800 s, per 900 s, all at 0;
  scenarios ``gavel100_p1800``, ``gavel100_p900``, ``gavel100_burst``; seed ``s`` draws the
  trace with generator seed ``s``, seed 0 being the scenario's file) and ``physical96``
  (Gavel's 96-job physical trace).
- **Settings** (the same for every policy): work estimates with lognormal noise ``--noise``
  (``scheduler.estimates``, seeded by the seed; the simulator runs the true work), a restart
  cost ``--restart-s`` per preemption or move (``SimConfig.preemption_cost_s``; policies with a
  ``preemption_cost_s`` parameter get it as their estimate), decision rounds ``--round-s``
  (the peers' ``round_s``; the engine's ``SimConfig.round_s`` too where the engine has it) and
  pair-throughput noise ``--pair-noise`` (``SimConfig.pair_noise`` where the engine has it;
  the peers never pack, so it only touches policies that read pair estimates). An engine
  without those fields runs without them, and the header says so. ``--hide-lengths SHARE``
  (0): that share of the jobs declares no length (``SimConfig.hide_lengths``: their profiles
  keep only relative speeds at a nominal hour; they report no progress). ``--set
  POLICY.PARAM=VALUE`` sets a parameter of one compared policy (e.g.
  ``hetero_srtf.unknown_lengths=fifo``); the header names it.
- **Figures** per trace and policy: median and range over the seeds of the average JCT, the
  99th-percentile JCT, the makespan and the largest finish-time-fairness ratio
  (``scheduler.ftf``, on the true job lengths), jobs completed of the total (the worst seed),
  and the ratios of the medians to the best peer's (the peer with the lowest median average
  JCT on that trace). A policy that left a job unfinished in some seed is flagged. Above each
  table, the average JCT that no policy can beat on that trace with those rounds
  (``scheduler.jct_bound``, from the true lengths), and its ratio to the best peer's: a goal
  such as 0.90x the best peer is out of reach where that ratio is above it. The column
  ``jct/bound`` gives each policy's median over the bound's; ``ftf_floor`` the median over
  the seeds of the largest ratio the decision rounds alone force in each run (a job that
  waits for the first round after its arrival and then runs alone on its fastest model,
  with that run's count of jobs present: ``scheduler.ftf.round_wait_floors``): where a
  policy's ``max_ftf`` equals it, no placement could have lowered that job's ratio.

``--quick``: the three 100-job traces and 3 seeds (unless ``--traces`` / ``--seeds`` say
otherwise). Progress goes to stderr; ``--out`` writes the summary CSV and, beside it,
``<stem>_runs.csv`` (one row per trace, policy and seed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints

from scheduler.domain import JobSpec

#: Our strongest policies (docs/policies.md) and the peers written from their papers.
OURS: tuple[str, ...] = ("hetero_srtf", "placement_rate")
PEERS: tuple[str, ...] = ("tiresias", "gavel_maxmin", "gavel_ftf", "allox", "themis")


@dataclass(frozen=True)
class TraceDef:
    """A comparison trace: its scenario and, for generated traces, how seed ``s`` draws it."""

    scenario: str
    generate: Mapping[str, Any] | None = None


TRACES: dict[str, TraceDef] = {
    "philly": TraceDef("philly_gavel"),
    "light": TraceDef("gavel100_p1800", {"jobs_per_hour": 2.0}),
    "contended": TraceDef("gavel100_p900", {"jobs_per_hour": 4.0}),
    "burst": TraceDef("gavel100_burst", {"burst": True}),
    "physical96": TraceDef("physical96"),
}
QUICK_TRACES = ("light", "contended", "burst")
METRICS = ("avg_jct_s", "p99_jct_s", "makespan_s", "max_ftf")
#: The largest finish-time-fairness ratio the decision rounds alone force in a run.
FLOOR = "max_ftf_floor"


def trace_jobs(trace: TraceDef, scenario_jobs: Sequence[JobSpec], seed: int) -> list[JobSpec]:
    """The jobs of ``trace`` for ``seed``: a generated trace is drawn again with generator seed
    ``seed`` (seed 0: the scenario's own file); other traces are the scenario's."""
    if trace.generate is None or seed == 0:
        return list(scenario_jobs)
    from scheduler.trace_generator import generate_jobs, write_gavel_trace
    from scheduler.traces import read_trace

    drawn = generate_jobs(100, seed=seed, duration_hours=(1.0, 4.0), **trace.generate)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"trace_seed{seed}.csv"
        write_gavel_trace(drawn, path)
        return read_trace(str(path), fmt="gavel")


def engine_options(config: Any, round_s: float, pair_noise: float) -> tuple[Any, list[str]]:
    """``config`` with ``round_s`` and ``pair_noise`` set where ``SimConfig`` has such fields,
    and the names of the options the engine lacks."""
    names = {f.name for f in dataclasses.fields(config)}
    wanted = {"round_s": round_s, "pair_noise": pair_noise}
    have = {k: v for k, v in wanted.items() if k in names}
    missing = [k for k, v in wanted.items() if k not in names and v]
    return dataclasses.replace(config, **have), missing


def policy_params(name: str, round_s: float, restart_s: float) -> dict[str, Any]:
    """A policy's parameters for the comparison: the peers' round, everybody's cost estimate."""
    from scheduler.policies.registry import policy_defaults

    defaults = policy_defaults(name)
    out: dict[str, Any] = {}
    if name in PEERS and "round_s" in defaults and name != "allox":
        out["round_s"] = round_s
    if "preemption_cost_s" in defaults:
        out["preemption_cost_s"] = restart_s
    return out


def run_metrics(
    result: Any,
    true_jobs: Sequence[JobSpec],
    counts: Mapping[str, int],
    round_s: float | None = None,
) -> dict[str, Any]:
    """The comparison's figures of one run; ``max_ftf_floor``: the largest ratio the
    decision rounds alone force in this run (``scheduler.ftf.round_wait_floors``)."""
    from scheduler.ftf import ftf_ratios, round_wait_floors
    from scheduler.metrics import summarize

    row = summarize(result)
    jcts = [r.jct_s for r in result.jobs if r.finish_s is not None and r.jct_s is not None]
    ratios = ftf_ratios(result, true_jobs, counts)
    floors = round_wait_floors(result, true_jobs, counts, round_s)
    return {
        "jobs": int(row["jobs"]),
        "completed": int(row["completed"]),
        "status": row["status"],
        "avg_jct_s": float(row["avg_jct_s"]),
        "p99_jct_s": float(np.percentile(jcts, 99)) if jcts else math.nan,
        "makespan_s": float(row["makespan_s"]),
        "max_ftf": max(ratios.values()) if ratios else math.nan,
        "max_ftf_floor": max(floors.values()) if floors else math.nan,
        "wall_s": float(row["wall_s"]),
    }


def run_peers(
    traces: Sequence[str],
    seeds: int,
    policies: Sequence[str],
    *,
    noise: float = 0.5,
    pair_noise: float = 0.3,
    round_s: float = 360.0,
    restart_s: float = 60.0,
    hide_lengths: float = 0.0,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    progress: Callable[[int], None] | None = None,
    notes: list[str] | None = None,
) -> pd.DataFrame:
    """One row per (trace, policy, seed) with ``run_metrics``' figures."""
    from scheduler.interference import build_interference
    from scheduler.jct_bound import avg_jct_lower_bound
    from scheduler.policies.registry import build_policy
    from scheduler.scenarios import load_scenario
    from scheduler.simulator import simulate

    rows = []
    for tname in traces:
        trace = TRACES[tname]
        sc = load_scenario(trace.scenario)
        model = None if sc.interference in (None, "none") else build_interference(sc.interference)
        counts: dict[str, int] = {}
        for node in sc.cluster.initial_nodes():
            for g in node.gpus:
                counts[g.spec.model] = counts.get(g.spec.model, 0) + 1
        for seed in range(seeds):
            truth = trace_jobs(trace, sc.jobs, seed)
            bound = avg_jct_lower_bound(truth, sc.cluster, round_s or None).avg_jct_s
            jobs = truth  # the engine draws the noisy estimates (and keeps the truth to itself)
            config = dataclasses.replace(
                sc.config,
                seed=seed,
                preemption_cost_s=restart_s,
                estimate_noise=noise,
                hide_lengths=hide_lengths,
            )
            config, missing = engine_options(config, round_s, pair_noise)
            if missing and notes is not None:
                text = (
                    f"engine has no {', '.join(missing)}: run without (policies' own rounds only)"
                )
                if text not in notes:
                    notes.append(text)
            for name in policies:
                params = {
                    **policy_params(name, round_s, restart_s),
                    **(overrides or {}).get(name, {}),
                }
                policy = build_policy(name, params)
                result = simulate(sc.cluster, jobs, policy, interference=model, config=config)
                rows.append(
                    {
                        "trace": tname,
                        "policy": name,
                        "kind": "peer" if name in PEERS else "ours",
                        "seed": seed,
                        **run_metrics(result, truth, counts, round_s or None),
                        "avg_jct_bound_s": bound,
                    }
                )
                if progress is not None:
                    progress(1)
    return pd.DataFrame(rows)


def summarize_peers(runs: pd.DataFrame) -> pd.DataFrame:
    """Per trace and policy: median, min and max of each metric over the seeds, the worst
    seed's completed jobs, and the medians' ratios to the best peer of the trace."""
    out = []
    for (tname, name), g in runs.groupby(["trace", "policy"], sort=False):
        row: dict[str, Any] = {"trace": tname, "policy": name, "kind": g["kind"].iloc[0]}
        row["seeds"] = len(g)
        for m in (*METRICS, *((FLOOR,) if FLOOR in g else ())):  # runs made without it
            row[f"{m}_median"] = float(g[m].median())
            row[f"{m}_min"] = float(g[m].min())
            row[f"{m}_max"] = float(g[m].max())
        if "avg_jct_bound_s" in g:
            row["avg_jct_bound_s_median"] = float(g["avg_jct_bound_s"].median())
            row["avg_jct_bound_s_min"] = float(g["avg_jct_bound_s"].min())
            row["avg_jct_bound_s_max"] = float(g["avg_jct_bound_s"].max())
        row["completed_min"] = int(g["completed"].min())
        row["jobs"] = int(g["jobs"].max())
        row["incomplete_seeds"] = int((g["completed"] < g["jobs"]).sum())
        out.append(row)
    summary = pd.DataFrame(out)
    if summary.empty:
        return summary
    for tname, g in summary.groupby("trace", sort=False):
        peers = g[(g["kind"] == "peer") & (g["incomplete_seeds"] == 0)]
        if peers.empty:
            peers = g[g["kind"] == "peer"]
        if peers.empty:
            continue
        best = peers.loc[peers["avg_jct_s_median"].idxmin()]
        idx = summary["trace"] == tname
        summary.loc[idx, "best_peer"] = best["policy"]
        for m in ("avg_jct_s", "p99_jct_s", "makespan_s"):
            summary.loc[idx, f"{m}_vs_best_peer"] = (
                summary.loc[idx, f"{m}_median"] / best[f"{m}_median"]
            )
        if "avg_jct_bound_s_median" in summary:
            summary.loc[idx, "avg_jct_bound_vs_best_peer"] = (
                summary.loc[idx, "avg_jct_bound_s_median"] / best["avg_jct_s_median"]
            )
    return summary


def _span(row: Mapping[str, Any], m: str, scale: float, fmt: str) -> str:
    med, lo, hi = (row[f"{m}_{k}"] / scale for k in ("median", "min", "max"))
    return f"{med:{fmt}} [{lo:{fmt}}-{hi:{fmt}}]"


def _ratios(g: pd.DataFrame, column: str) -> list[str]:
    """The ratio column as text; "-" where the run had no peer to compare with."""
    if column not in g:
        return ["-"] * len(g)
    return [f"{v:.2f}" for v in g[column]]


def format_peers(summary: pd.DataFrame) -> str:
    """The per-trace tables as text (JCTs and makespans in hours)."""
    lines: list[str] = []
    for tname, g in summary.groupby("trace", sort=False):
        best = g["best_peer"].iloc[0] if "best_peer" in g else "none (no peer in the run)"
        lines.append(f"== {tname} (best peer by median avg JCT: {best}; times in hours, "
                     f"median [min-max] over {int(g['seeds'].max())} seeds)")  # fmt: skip
        if "avg_jct_bound_s_median" in g and not math.isnan(g["avg_jct_bound_s_median"].iloc[0]):
            r0 = g.iloc[0]
            vs = r0.get("avg_jct_bound_vs_best_peer")
            lines.append(
                "   no policy can beat: avg JCT >= "
                + _span(r0, "avg_jct_bound_s", 3600, ".2f")
                + " h (scheduler.jct_bound, true lengths)"
                + (f" = {vs:.2f}x the best peer" if vs is not None and not math.isnan(vs) else "")
            )
        table = pd.DataFrame(
            {
                "policy": g["policy"],
                "kind": g["kind"],
                "avg_jct_h": [_span(r, "avg_jct_s", 3600, ".2f") for _, r in g.iterrows()],
                "p99_jct_h": [_span(r, "p99_jct_s", 3600, ".1f") for _, r in g.iterrows()],
                "makespan_h": [_span(r, "makespan_s", 3600, ".1f") for _, r in g.iterrows()],
                "max_ftf": [_span(r, "max_ftf", 1, ".2f") for _, r in g.iterrows()],
                "ftf_floor": [
                    f"{r[f'{FLOOR}_median']:.2f}" if f"{FLOOR}_median" in r else "-"
                    for _, r in g.iterrows()
                ],
                "done": [
                    f"{r['completed_min']}/{r['jobs']}"
                    + (
                        f" ({r['incomplete_seeds']} seeds INCOMPLETE)"
                        if r["incomplete_seeds"]
                        else ""
                    )
                    for _, r in g.iterrows()
                ],
                "jct_x": _ratios(g, "avg_jct_s_vs_best_peer"),
                "p99_x": _ratios(g, "p99_jct_s_vs_best_peer"),
                "mksp_x": _ratios(g, "makespan_s_vs_best_peer"),
            }
        )
        if "avg_jct_bound_s_median" in g:
            table["jct/bound"] = [
                f"{r['avg_jct_s_median'] / r['avg_jct_bound_s_median']:.2f}"
                if r["avg_jct_bound_s_median"] > 0
                else "-"
                for _, r in g.iterrows()
            ]
        lines.append(table.to_string(index=False))
        lines.append("")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m scheduler.reproduce peers",
        description="Our policies against the peers (tiresias, gavel, allox, themis).",
    )
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 10; --quick 3)")
    p.add_argument("--traces", nargs="+", choices=sorted(TRACES), default=None,
                   help="default: all (--quick: light contended burst)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="the 100-job traces, 3 seeds")
    p.add_argument("--policies", nargs="+", default=None,
                   help=f"default: {' '.join(OURS + PEERS)}")  # fmt: skip
    p.add_argument("--noise", type=float, default=0.5, help="estimate noise sigma (0.5)")
    p.add_argument("--pair-noise", type=float, default=0.3, help="pair estimate noise (0.3)")
    p.add_argument("--round-s", type=float, default=360.0, help="decision round, s (360)")
    p.add_argument("--restart-s", type=float, default=60.0, help="restart cost, s (60)")
    p.add_argument("--set", action="append", default=[], metavar="POLICY.PARAM=VALUE",
                   help="a policy parameter for this comparison, e.g. "
                   "hetero_srtf.unknown_lengths=fifo (JSON values; repeatable)")  # fmt: skip
    p.add_argument("--hide-lengths", type=float, default=0.0,
                   help="share of jobs that declare no length (0)")  # fmt: skip
    p.add_argument("--out", help="summary CSV (runs go beside it as <stem>_runs.csv)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else (3 if args.quick else 10)
    if seeds < 1:
        parser.error("--seeds must be >= 1")
    for flag in ("noise", "pair_noise", "round_s", "restart_s"):
        value = getattr(args, flag)
        if not (value >= 0 and math.isfinite(value)):
            parser.error(f"--{flag.replace('_', '-')} must be a number >= 0")
    if not 0 <= args.hide_lengths <= 1:
        parser.error("--hide-lengths must be a share in [0, 1]")
    overrides: dict[str, dict[str, Any]] = {}
    for item in args.set:
        name, dot, rest = item.partition(".")
        param, eq, raw = rest.partition("=")
        if not dot or not eq or not name or not param:
            parser.error(f"--set {item!r}: expected POLICY.PARAM=VALUE")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw  # a bare word: a string
        overrides.setdefault(name, {})[param] = value
    traces = args.traces or (list(QUICK_TRACES) if args.quick else list(TRACES))
    policies = args.policies or list(OURS + PEERS)
    from scheduler.policies.registry import PolicyError, build_policy, policy_class

    for name in policies:
        try:
            policy_class(name)
        except PolicyError as exc:
            parser.error(str(exc))
    for name, params in overrides.items():
        if name not in policies:
            parser.error(f"--set names {name!r}, which is not among the policies compared")
        try:
            build_policy(name, {**policy_params(name, args.round_s, args.restart_s), **params})
        except PolicyError as exc:
            parser.error(f"--set: {exc}")
    total = len(traces) * seeds * len(policies)
    bar = None
    tick: Callable[[int], None] | None = None
    if not args.quiet:
        from tqdm import tqdm  # type: ignore[import-untyped]  # no types-tqdm installed

        bar = tqdm(total=total, unit="run", file=sys.stderr, desc="peers")
        tick = bar.update
    notes: list[str] = []
    try:
        runs = run_peers(
            traces,
            seeds,
            policies,
            noise=args.noise,
            pair_noise=args.pair_noise,
            round_s=args.round_s,
            restart_s=args.restart_s,
            hide_lengths=args.hide_lengths,
            overrides=overrides,
            progress=tick,
            notes=notes,
        )
    finally:
        if bar is not None:
            bar.close()
    summary = summarize_peers(runs)
    print(
        f"peers: {len(policies)} policies x {len(traces)} traces x {seeds} seeds; estimate "
        f"noise {args.noise}, pair noise {args.pair_noise}, rounds {args.round_s:g} s, restart "
        f"cost {args.restart_s:g} s"
        + (f"; {args.hide_lengths:.0%} of the jobs declare no length" if args.hide_lengths else "")
        + "".join(
            f"; {name} with {', '.join(f'{k}={v!r}' for k, v in params.items())}"
            for name, params in overrides.items()
        )
    )
    for line in notes:
        print(f"note: {line}")
    print(format_peers(summary))
    if args.out:
        out = Path(args.out)
        if out.suffix != ".csv":
            out.mkdir(parents=True, exist_ok=True)
            out = out / "peers.csv"
        out.parent.mkdir(parents=True, exist_ok=True)
        summary.to_csv(out, index=False)
        runs_path = out.with_name(f"{out.stem}_runs.csv")
        runs.to_csv(runs_path, index=False)
        print(f"wrote {out}, {runs_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
