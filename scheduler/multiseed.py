"""Multi-seed comparisons: the same trace under several policies over many seeds.

With noisy estimates (``SimConfig.estimate_noise``), a noisy pair prior (``pair_noise``) and
Gavel's rounds (``round_s``), one seed is one draw of the noise; reports give the median and
the range over seeds (issue 24: >= 10 seeds). ``run_seeds`` returns one row per (policy,
seed); ``seed_summary`` folds them into median / min / max per policy. A run that did not
complete every admitted job is marked (``completed`` < ``admitted``), never averaged over the
jobs that did finish as if it had.

    python -m scheduler.multiseed --scenario gavel100_p900 --policy fifo --policy hetero_srtf \\
        --seeds 10 --headline
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints

from scheduler.simulator.results import SimConfig

#: The setting of the headline figures (issue 24): estimate noise 0.5, pair noise 0.3,
#: 360 s rounds, 60 s restart cost.
HEADLINE = {"estimate_noise": 0.5, "pair_noise": 0.3, "round_s": 360.0, "preemption_cost_s": 60.0}

#: Oracle figures: exact estimates and pairs, decisions on every event; same restart cost.
ORACLE = {"estimate_noise": 0.0, "pair_noise": 0.0, "round_s": None, "preemption_cost_s": 60.0}

METRICS = ("avg_jct_s", "p99_jct_s", "makespan_s", "max_ftf")


def run_seeds(
    policies: Sequence[str],
    cluster: Any,
    jobs: Sequence[Any],
    config: SimConfig,
    seeds: Sequence[int],
    *,
    interference: str | None = "measured",
    params: Mapping[str, Mapping[str, Any]] | None = None,
    log: bool = False,
) -> pd.DataFrame:
    """One row per (policy, seed): ``avg_jct_s``, ``p99_jct_s``, ``makespan_s``, ``max_ftf``
    (largest finish-time-fairness ratio, ``scheduler.ftf``), ``completed``, ``admitted``,
    ``total`` jobs, ``preemptions``, ``wall_s``. ``config`` is replaced by ``seed`` per run
    (the noise draws follow it); policies are built fresh per run, with the simulated restart
    cost as their estimate of it where they take one."""
    from scheduler.ftf import ftf_ratios
    from scheduler.interference import build_interference
    from scheduler.policies.registry import build_policy
    from scheduler.simulate import _with_cost
    from scheduler.simulator import simulate

    params = params or {}
    counts: dict[str, int] = {}
    for n in cluster.nodes:
        if n.gpu_model is not None:
            counts[n.gpu_model] = counts.get(n.gpu_model, 0) + n.gpu_count
    rows = []
    for name in policies:
        for seed in seeds:
            cfg = dataclasses.replace(config, seed=seed)
            policy = build_policy(name, _with_cost(name, params.get(name), cfg))
            model = None if interference in (None, "none") else build_interference(interference)
            t0 = time.perf_counter()
            res = simulate(cluster, jobs, policy, interference=model, config=cfg)
            admitted = [r for r in res.jobs if r.end_reason != "rejected"]
            done = [r for r in admitted if r.end_reason == "completed"]
            jcts = sorted(r.jct_s for r in done if r.jct_s is not None)
            row: dict[str, Any] = {
                "policy": name,
                "seed": seed,
                "total": len(res.jobs),
                "admitted": len(admitted),
                "completed": len(done),
                "preemptions": sum(r.preemptions for r in res.jobs),
                "wall_s": time.perf_counter() - t0,
            }
            if jcts:
                rho = ftf_ratios(res, jobs, counts)
                row.update(
                    avg_jct_s=statistics.fmean(jcts),
                    p99_jct_s=jcts[min(len(jcts) - 1, round(0.99 * (len(jcts) - 1)))],
                    makespan_s=max(r.finish_s or 0.0 for r in done)
                    - min(r.arrival_s for r in admitted),
                    max_ftf=max(rho.values()) if rho else float("nan"),
                )
            rows.append(row)
            if log:
                print(f"  {name} seed {seed}: {_fmt(row)}", file=sys.stderr)
    cols = ["policy", "seed", *METRICS, "completed", "admitted", "total", "preemptions", "wall_s"]
    return pd.DataFrame(rows, columns=cols)


def _fmt(row: Mapping[str, Any]) -> str:
    if row["completed"] < row["admitted"] or "avg_jct_s" not in row:
        return f"INCOMPLETE {row['completed']} of {row['admitted']}"
    return (
        f"avg JCT {row['avg_jct_s']:,.0f} s, p99 {row['p99_jct_s']:,.0f} s, "
        f"makespan {row['makespan_s']:,.0f} s, max FTF {row['max_ftf']:.2f} "
        f"({row['wall_s']:.1f} s)"
    )


def seed_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per policy: seeds, seeds that completed every admitted job, and median / min / max
    of each metric over the seeds."""
    out = []
    for name, g in frame.groupby("policy", sort=False):
        row: dict[str, Any] = {
            "policy": name,
            "seeds": len(g),
            "complete_seeds": int((g["completed"] == g["admitted"]).sum()),
        }
        for m in METRICS:
            v = g[m].dropna()
            row[f"{m}_median"] = float(v.median()) if len(v) else float("nan")
            row[f"{m}_min"] = float(v.min()) if len(v) else float("nan")
            row[f"{m}_max"] = float(v.max()) if len(v) else float("nan")
        out.append(row)
    return pd.DataFrame(out)


def markdown(summary: pd.DataFrame, *, title: str = "") -> str:
    """A table: median (min-max) per metric, one row per policy."""
    lines = [f"**{title}**\n"] if title else []
    lines.append("| policy | seeds complete | avg JCT (h) | p99 JCT (h) | makespan (h) | max FTF |")
    lines.append("|---|---:|---:|---:|---:|---:|")

    def cell(r: Any, m: str, scale: float = 3600.0, fmt: str = "{:.1f}") -> str:
        med, lo, hi = (r[f"{m}_{k}"] / scale for k in ("median", "min", "max"))
        if med != med:  # NaN
            return "-"
        return f"{fmt.format(med)} ({fmt.format(lo)}-{fmt.format(hi)})"

    for _, r in summary.iterrows():
        lines.append(
            f"| {r['policy']} | {r['complete_seeds']}/{r['seeds']} | {cell(r, 'avg_jct_s')} | "
            f"{cell(r, 'p99_jct_s')} | {cell(r, 'makespan_s')} | "
            f"{cell(r, 'max_ftf', 1.0, '{:.2f}')} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from scheduler.scenarios import load_scenario

    p = argparse.ArgumentParser(prog="python -m scheduler.multiseed", description=__doc__)
    p.add_argument("--scenario", required=True)
    p.add_argument("--policy", action="append", dest="policies", required=True)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--limit", type=int, help="first N jobs of the trace only")
    p.add_argument("--headline", action="store_true", help="noise 0.5, pair 0.3, 360 s, 60 s")
    p.add_argument("--oracle", action="store_true", help="exact estimates, events, 60 s")
    p.add_argument("--estimate-noise", type=float)
    p.add_argument("--pair-noise", type=float)
    p.add_argument("--round-s", type=float)
    p.add_argument("--preemption-cost-s", type=float)
    p.add_argument("--csv", help="write the per-seed rows here")
    args = p.parse_args(argv)
    if args.seeds < 1:
        print("error: --seeds must be >= 1", file=sys.stderr)
        return 2
    sc = load_scenario(args.scenario)
    jobs = list(sc.jobs)[: args.limit] if args.limit else list(sc.jobs)
    over: dict[str, Any] = dict(HEADLINE if args.headline else ORACLE if args.oracle else {})
    for key in ("estimate_noise", "pair_noise", "round_s", "preemption_cost_s"):
        if getattr(args, key) is not None:
            over[key] = getattr(args, key)
    try:
        config = dataclasses.replace(sc.config, **over)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    frame = run_seeds(
        args.policies,
        sc.cluster,
        jobs,
        config,
        range(args.seeds),
        interference=sc.interference or "measured",
        params=sc.policy_params,
        log=True,
    )
    if args.csv:
        frame.to_csv(args.csv, index=False)
    setting = ", ".join(f"{k} {v}" for k, v in over.items())
    print(markdown(seed_summary(frame), title=f"{args.scenario} ({setting})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
