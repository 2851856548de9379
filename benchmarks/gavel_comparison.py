"""Every policy on the Gavel-style scenarios, at two preemption costs and with noisy estimates.

    python -m benchmarks.gavel_comparison [--quick] [--scenario NAME ...] [--policy NAME ...]
        [--cost S ...] [--noise SIGMA] [--noise-seeds N] [--markdown FILE]

For each scenario (default: ``philly_gavel``, ``philly``, ``physical96``, ``gavel100_burst``,
``gavel100_p900``, ``gavel100_p1800``, ``gavel100_burst36``) and each policy it runs the
simulator with interference ``measured`` at each preemption cost (default 0 s, Gavel's
assumption, and 60 s), and once more at 0 s with every job's work estimate multiplied by
lognormal noise ``exp(N(0, sigma))`` (sigma 0.5; seeds 0 .. ``noise_seeds - 1``, averaged),
the simulator running the true work (``scheduler.estimates``). Policies that take a
``preemption_cost_s`` parameter get the simulated cost as their estimate of it.

Columns: average JCT, makespan, p99 JCT (s), the largest finish-time-fairness ratio
(``scheduler.ftf``) and preemptions per job (requeues by the policy, moves included). A run
that did not complete every admitted job says so instead of averaging the jobs that finished.
``--quick`` runs the 100-job scenarios only.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from scheduler.estimates import with_noisy_estimates
from scheduler.ftf import ftf_ratios
from scheduler.interference import build_interference
from scheduler.policies.registry import build_policy, policy_defaults
from scheduler.scenarios import load_scenario
from scheduler.simulator import simulate

SCENARIOS = (
    "philly_gavel",
    "philly",
    "physical96",
    "gavel100_burst",
    "gavel100_p900",
    "gavel100_p1800",
    "gavel100_burst36",
)
QUICK_SCENARIOS = ("gavel100_burst", "gavel100_p900", "gavel100_p1800", "gavel100_burst36")
#: The placement policies that apply to Gavel jobs (whole GPUs, no memory data). The
#: ``+exec_plan`` wrappers give their base policy's schedules on these traces (no memory
#: steps) and are left out; the sharing-mode and kernel policies need MIG/kernel profiles.
POLICIES = (
    "fifo",
    "binpack",
    "loadbalance",
    "random",
    "mystic",
    "placement_rate",
    "all_gpu",
    "hetero_srtf",
)
#: Gavel's best average JCT on the 951-job Philly trace on 36 one-GPU servers (issue 13).
GAVEL_PHILLY_BEST_S = 187_799.0


def run_one(
    scenario: str, policy: str, *, cost_s: float, noise: float | None, seed: int
) -> dict[str, Any]:
    """One simulation; its row (metrics of the true jobs)."""
    sc = load_scenario(scenario)
    jobs = list(sc.jobs)
    true_jobs = jobs
    truth: dict[str, float] = {}
    if noise:
        jobs, truth = with_noisy_estimates(jobs, noise, seed)
    config = dataclasses.replace(sc.config, preemption_cost_s=cost_s)
    params = dict(sc.policy_params.get(policy, {}))
    if "preemption_cost_s" in policy_defaults(policy):
        params.setdefault("preemption_cost_s", cost_s)
    res = simulate(
        sc.cluster,
        jobs,
        build_policy(policy, params),
        interference=build_interference(sc.interference or "measured"),
        config=config,
        true_work=truth,
    )
    counts: dict[str, int] = {}
    for n in sc.cluster.nodes:
        if n.gpu_model is not None:
            counts[n.gpu_model] = counts.get(n.gpu_model, 0) + n.gpu_count
    admitted = [r for r in res.jobs if r.end_reason != "rejected"]
    done = [r for r in admitted if r.end_reason == "completed"]
    row: dict[str, Any] = {
        "scenario": scenario,
        "policy": policy,
        "cost_s": cost_s,
        "noise": noise or 0.0,
        "seed": seed,
        "jobs": len(res.jobs),
        "completed": len(done),
        "admitted": len(admitted),
        "wall_s": res.wall_s,
        "decision_ms_p50": 1000 * statistics.median(res.decision_latency_s or [0.0]),
    }
    if len(done) != len(admitted) or not done:
        row["status"] = f"incomplete: {len(done)} of {len(admitted)} completed"
        return row
    jcts = sorted(r.jct_s for r in done if r.jct_s is not None)
    rho = ftf_ratios(res, true_jobs, counts)
    row.update(
        status="complete",
        avg_jct_s=statistics.fmean(jcts),
        makespan_s=max(r.finish_s or 0.0 for r in done) - min(r.arrival_s for r in done),
        p99_jct_s=jcts[min(len(jcts) - 1, round(0.99 * (len(jcts) - 1)))],
        max_ftf=max(rho.values()) if rho else float("nan"),
        preemptions_per_job=sum(r.preemptions for r in res.jobs) / len(res.jobs),
    )
    return row


def run_grid(
    scenarios: Sequence[str],
    policies: Sequence[str],
    costs: Sequence[float],
    noise: float,
    noise_seeds: int,
) -> list[dict[str, Any]]:
    rows = []
    for sc in scenarios:
        for pol in policies:
            for cost in costs:
                t0 = time.perf_counter()
                rows.append(run_one(sc, pol, cost_s=cost, noise=None, seed=0))
                print(
                    f"  {sc} {pol} cost {cost:g}: {_fmt(rows[-1])} "
                    f"({time.perf_counter() - t0:.1f} s)",
                    file=sys.stderr,
                )
            if noise > 0:
                noisy = [
                    run_one(sc, pol, cost_s=costs[0], noise=noise, seed=s)
                    for s in range(noise_seeds)
                ]
                rows.append(_mean_row(noisy))
                print(f"  {sc} {pol} noisy: {_fmt(rows[-1])}", file=sys.stderr)
    return rows


def _mean_row(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out = dict(rows[0])
    out["seeds"] = len(rows)
    if any(r["status"] != "complete" for r in rows):
        bad = [r for r in rows if r["status"] != "complete"]
        out["status"] = f"{len(bad)} of {len(rows)} seeds incomplete: {bad[0]['status']}"
        return out
    for key in ("avg_jct_s", "makespan_s", "p99_jct_s", "max_ftf", "preemptions_per_job"):
        out[key] = statistics.fmean(r[key] for r in rows)
    return out


def _fmt(row: dict[str, Any]) -> str:
    if row["status"] != "complete":
        return row["status"]
    return (
        f"avg JCT {row['avg_jct_s']:,.0f} s, makespan {row['makespan_s']:,.0f} s, "
        f"p99 {row['p99_jct_s']:,.0f} s, max FTF {row['max_ftf']:.2f}, "
        f"{row['preemptions_per_job']:.2f} preemptions/job"
    )


_METRICS = ("avg_jct_s", "makespan_s", "p99_jct_s", "max_ftf", "preemptions_per_job")


def _setting(r: dict[str, Any]) -> str:
    if r["noise"]:
        return (
            f"noisy estimates (sigma {r['noise']:g}, {r.get('seeds', 1)} seeds), {r['cost_s']:g} s"
        )
    return f"cost {r['cost_s']:g} s"


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """One table per scenario: a row per policy and setting; a policy whose settings all gave
    the same figures (it never preempts, and noise scales every model's time alike) gets one
    row, "every setting"."""
    out = []
    for sc in dict.fromkeys(r["scenario"] for r in rows):
        out.append(f"**`{sc}`**\n")
        out.append(
            "| policy | setting | avg JCT (s) | avg JCT (h) | makespan (s) | p99 JCT (s) | "
            "max FTF ratio | preemptions / job |"
        )
        out.append("|---|---|---:|---:|---:|---:|---:|---:|")
        mine = [r for r in rows if r["scenario"] == sc]
        for pol in dict.fromkeys(r["policy"] for r in mine):
            group = [r for r in mine if r["policy"] == pol]
            same = all(r["status"] == "complete" for r in group) and all(
                all(math.isclose(r[k], group[0][k], rel_tol=1e-9) for k in _METRICS) for r in group
            )
            for r in group[:1] if same and len(group) > 1 else group:
                setting = "every setting (identical)" if same and len(group) > 1 else _setting(r)
                if r["status"] != "complete":
                    out.append(f"| {pol} | {setting} | {r['status']} | | | | | |")
                    continue
                out.append(
                    f"| {pol} | {setting} | {r['avg_jct_s']:,.0f} | "
                    f"{r['avg_jct_s'] / 3600:.2f} | {r['makespan_s']:,.0f} | "
                    f"{r['p99_jct_s']:,.0f} | {r['max_ftf']:.2f} | "
                    f"{r['preemptions_per_job']:.2f} |"
                )
        out.append("")
    return "\n".join(out)


def run(quick: bool = False) -> dict:
    """Benchmark-runner entry point: the quick grid (100-job scenarios)."""
    scenarios = QUICK_SCENARIOS if quick else SCENARIOS
    rows = run_grid(scenarios, POLICIES, (0.0, 60.0), 0.5, 1 if quick else 3)
    print(markdown(rows))
    best = {
        r["scenario"]: r["avg_jct_s"]
        for r in rows
        if r["policy"] == "hetero_srtf" and r["cost_s"] == 0 and not r["noise"]
        if r["status"] == "complete"
    }
    return {"rows": rows, "summary": {f"hetero_srtf avg JCT {k} (s)": v for k, v in best.items()}}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gavel_comparison")
    p.add_argument("--quick", action="store_true", help="the 100-job scenarios only")
    p.add_argument("--scenario", action="append", dest="scenarios")
    p.add_argument("--policy", action="append", dest="policies")
    p.add_argument("--cost", action="append", type=float, dest="costs")
    p.add_argument("--noise", type=float, default=0.5, help="sigma (0: no noisy run)")
    p.add_argument("--noise-seeds", type=int, default=3)
    p.add_argument("--markdown", help="also write the tables to this file")
    p.add_argument("--json", help="also write the rows as JSON to this file")
    args = p.parse_args(argv)
    scenarios = args.scenarios or (QUICK_SCENARIOS if args.quick else SCENARIOS)
    rows = run_grid(
        scenarios,
        args.policies or POLICIES,
        args.costs or (0.0, 60.0),
        args.noise,
        args.noise_seeds,
    )
    text = markdown(rows)
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    if args.json:
        import json

        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
