"""Command line: compare policies on a trace and a cluster (docs/simulator.md).

    python -m scheduler.simulate --trace T --cluster C --policy fifo --policy binpack \
        [--interference measured|class_based|none] [--seed N] [--out DIR]
    python -m scheduler.simulate --scenario philly [--policy P ...] [--out DIR]
    python -m scheduler.simulate --list-scenarios

Prints one row per policy. With ``--out`` writes ``summary.csv`` (one row per policy),
``jobs.csv`` (one row per job and policy, with where it ran and why) and ``report.html``
(self-contained plotly report). Bad input prints one line naming file, line and field and
exits with status 2; a policy that returns an impossible plan exits with status 3.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints (no pandas-stubs)

from scheduler.inputs import InputError
from scheduler.simulator.results import OomAction, SimConfig, SimResult, SimulationError

TABLE_COLUMNS = {
    "policy": "policy",
    "jobs": "jobs",
    "completed": "done",
    "rejected": "rejected",
    "failed_oom": "failed",
    "unschedulable": "unsched",
    "unfinished": "unfin",
    "avg_jct_s": "avg_jct_s",
    "avg_queue_s": "avg_queue_s",
    "makespan_s": "makespan_s",
    "gpu_util": "gpu_util",
    "avg_slowdown": "avg_sd",
    "max_slowdown": "max_sd",
    "weighted_speedup": "w_speedup",
    "antt": "antt",
    "fairness": "fairness",
    "oom_count": "oom",
    "decision_ms_p50": "dec_ms_p50",
    "decision_ms_p99": "dec_ms_p99",
    "wall_s": "wall_s",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m scheduler.simulate",
        description="Replay a job trace on a simulated GPU cluster under one or more policies.",
    )
    src = p.add_argument_group("input (a scenario, or a trace and a cluster)")
    src.add_argument("--scenario", help="built-in scenario name or scenario YAML path")
    src.add_argument("--list-scenarios", action="store_true", help="list built-in scenarios")
    src.add_argument("--trace", help="trace CSV (Gavel, Cosched profile trace, Alibaba pods)")
    src.add_argument(
        "--trace-format",
        choices=["gavel", "profile", "alibaba"],
        help="trace format (default: detected from the header)",
    )
    src.add_argument("--profiles", help="profiles YAML of a profile trace")
    src.add_argument("--cluster", help="cluster spec YAML")
    src.add_argument("--limit", type=int, help="only the first N jobs of the trace")
    p.add_argument(
        "--policy",
        action="append",
        dest="policies",
        metavar="NAME",
        help="policy to run (repeatable; default: the scenario's, else fifo)",
    )
    p.add_argument(
        "--interference",
        help="measured, class_based or none (default: the scenario's, else measured)",
    )
    p.add_argument("--seed", type=int, help="random seed (default: the scenario's, else 0)")
    p.add_argument("--oom-action", choices=[a.value for a in OomAction])
    p.add_argument("--context-switch-overhead", type=float, metavar="FRACTION")
    p.add_argument(
        "--reschedule-interval",
        type=float,
        metavar="SECONDS",
        help="also call the policy periodically",
    )
    p.add_argument("--max-time", type=float, metavar="SECONDS", help="stop at this time")
    p.add_argument(
        "--unconsolidated-speed",
        type=float,
        metavar="FRACTION",
        help="speed of a job spread over nodes whose profile has no unconsolidated time "
        "(default 0.74: the median of Gavel's measured ratios)",
    )
    p.add_argument(
        "--preemption-cost-s",
        type=float,
        metavar="SECONDS",
        help="checkpoint-and-restart time of a preempted or migrated job (default: the "
        "scenario's, else 0, Gavel's assumption); policies with a preemption_cost_s parameter "
        "get it too unless their parameters set one",
    )
    p.add_argument(
        "--estimate-noise",
        type=float,
        metavar="SIGMA",
        help="multiply each job's work estimate by lognormal noise exp(N(0, SIGMA)), seeded "
        "by --seed; the simulator runs the true work, which policies never see "
        "(scheduler/estimates.py)",
    )
    p.add_argument(
        "--pair-noise",
        type=float,
        metavar="SIGMA",
        help="lognormal noise on the pair table policies start from (the knowledge's prior; "
        "0: the simulator's exact table, an oracle); measured co-runs refine it",
    )
    p.add_argument(
        "--hide-lengths",
        type=float,
        metavar="SHARE",
        help="that share of the jobs (drawn by --seed) declares no length: policies see only "
        "their relative speed per GPU model and no progress (scheduler/estimates.py)",
    )
    p.add_argument(
        "--round-s",
        type=float,
        metavar="SECONDS",
        help="consult the policy only every SECONDS (Gavel's rounds); arrivals wait for the "
        "next round",
    )
    p.add_argument("--out", help="directory for summary.csv, jobs.csv and report.html")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SimulationError as exc:
        print(f"simulation error: {exc}", file=sys.stderr)
        return 3
    except ValueError as exc:  # PolicyError, InterferenceError: bad names or parameters
        if type(exc).__module__.startswith("scheduler."):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        raise


def _run(args: argparse.Namespace) -> int:
    from scheduler.scenarios import list_scenarios, load_scenario

    if args.list_scenarios:
        for name, desc in list_scenarios():
            print(f"{name:14} {desc}")
        return 0
    if args.scenario:
        sc = load_scenario(args.scenario)
        title = f"scenario {sc.name}"
        cluster, jobs, config = sc.cluster, list(sc.jobs), sc.config
        policies = args.policies or list(sc.policies)
        params = sc.policy_params
        interference = args.interference or sc.interference
    else:
        if not args.trace or not args.cluster:
            raise InputError(
                "give --scenario NAME, or both --trace and --cluster (see --help, --list-scenarios)"
            )
        from scheduler.cluster_spec import load_cluster_spec
        from scheduler.traces import read_trace

        cluster = load_cluster_spec(args.cluster)
        jobs = read_trace(args.trace, fmt=args.trace_format, profiles=args.profiles, limit=None)
        title = f"{Path(args.trace).name} on {Path(args.cluster).name}"
        config = SimConfig()
        policies = args.policies or ["fifo"]
        params = {}
        interference = args.interference or "measured"
    if args.limit is not None:
        jobs = jobs[: args.limit]
    overrides: dict[str, Any] = {}
    if args.seed is not None:
        overrides["seed"] = args.seed
    if args.oom_action:
        overrides["oom_action"] = OomAction(args.oom_action)
    if args.context_switch_overhead is not None:
        overrides["context_switch_overhead"] = args.context_switch_overhead
    if args.reschedule_interval is not None:
        overrides["reschedule_interval_s"] = args.reschedule_interval
    if args.max_time is not None:
        overrides["max_time_s"] = args.max_time
    if args.unconsolidated_speed is not None:
        overrides["unconsolidated_speed"] = args.unconsolidated_speed
    if args.preemption_cost_s is not None:
        overrides["preemption_cost_s"] = args.preemption_cost_s
    for field_name, flag in (
        ("estimate_noise", "--estimate-noise"),
        ("pair_noise", "--pair-noise"),
        ("round_s", "--round-s"),
        ("hide_lengths", "--hide-lengths"),
    ):
        value = getattr(args, field_name)
        if value is not None:
            try:
                dataclasses.replace(SimConfig(), **{field_name: value})
            except ValueError as exc:
                raise InputError(str(exc), file="command line", field=flag) from None
            overrides[field_name] = value
    try:
        config = dataclasses.replace(config, **overrides)
    except ValueError as exc:  # SimConfig's own range checks
        raise InputError(str(exc), file="command line") from None

    results = run_policies(
        cluster,
        jobs,
        policies,
        params=params,
        interference=interference,
        config=config,
        progress=not args.quiet,
    )
    summary = summary_frame(results)
    print(
        f"{title}: {len(jobs)} jobs, {cluster.describe()}, interference {interference}, "
        f"seed {config.seed}"
    )
    print(format_table(summary))
    from scheduler.metrics import summary_notes

    for line in summary_notes(summary):
        print(line)
    if args.out:
        paths = write_outputs(
            Path(args.out),
            results,
            summary,
            title=title,
            notes=f"{len(jobs)} jobs; {cluster.describe()}; "
            f"interference {interference}; seed {config.seed}",
        )
        print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def run_policies(
    cluster: Any,
    jobs: Sequence[Any],
    policies: Sequence[str],
    *,
    params: Any = None,
    interference: str | None = "none",
    config: SimConfig | None = None,
    progress: bool = False,
) -> list[SimResult]:
    """Simulate ``jobs`` on ``cluster`` once per policy name (built by the registry)."""
    from scheduler.interference import build_interference
    from scheduler.policies.registry import build_policy
    from scheduler.simulator import simulate

    params = params or {}
    built = [
        build_policy(name, _with_cost(name, params.get(name), config)) for name in policies
    ]  # fail fast on names
    model = None if interference in (None, "none") else build_interference(interference)
    results = []
    bar, tick = _progress_bar(len(jobs) * len(built), enabled=progress)
    try:
        for policy in built:
            done_before = [0]

            def on_end(done: int, total: int, _seen: list[int] = done_before) -> None:
                tick(done - _seen[0])
                _seen[0] = done

            results.append(
                simulate(
                    cluster, jobs, policy, interference=model, config=config, on_job_end=on_end
                )
            )
            tick(len(jobs) - done_before[0])
    finally:
        if bar is not None:
            bar.close()
    return results


def _with_cost(name: str, given: Any, config: SimConfig | None) -> dict[str, Any]:
    """A policy's parameters, with the simulated preemption cost as its estimate of it when
    the policy takes a ``preemption_cost_s`` parameter that its parameters leave unset."""
    from scheduler.policies.registry import policy_defaults

    out = dict(given or {})
    wants = "preemption_cost_s" in policy_defaults(name)
    if config is not None and wants and "preemption_cost_s" not in out:
        out["preemption_cost_s"] = config.preemption_cost_s
    return out


def _progress_bar(total: int, *, enabled: bool) -> tuple[Any, Callable[[int], None]]:
    if not enabled or not sys.stderr.isatty():
        return None, lambda n: None
    from tqdm import tqdm  # type: ignore[import-untyped]  # no types-tqdm installed

    bar = tqdm(total=total, unit="job", file=sys.stderr, leave=False)
    return bar, bar.update


def summary_frame(results: Sequence[SimResult]) -> pd.DataFrame:
    """One row per policy (``scheduler.metrics.SUMMARY_COLUMNS``)."""
    from scheduler.metrics import SUMMARY_COLUMNS, summarize

    return pd.DataFrame([summarize(r) for r in results], columns=SUMMARY_COLUMNS)


def format_table(summary: pd.DataFrame) -> str:
    """The comparison table as fixed-width text."""
    table = summary[list(TABLE_COLUMNS)].rename(columns=TABLE_COLUMNS)
    formats = {
        "avg_jct_s": "{:,.0f}",
        "avg_queue_s": "{:,.0f}",
        "makespan_s": "{:,.0f}",
        "gpu_util": "{:.3f}",
        "avg_sd": "{:.2f}",
        "max_sd": "{:.2f}",
        "w_speedup": "{:.2f}",
        "antt": "{:.2f}",
        "fairness": "{:.2f}",
        "dec_ms_p50": "{:.3f}",
        "dec_ms_p99": "{:.3f}",
        "wall_s": "{:.2f}",
    }
    shown = table.copy().astype(object)
    for col, fmt in formats.items():
        shown[col] = [("-" if pd.isna(v) else fmt.format(v)) for v in table[col]]
    return shown.to_string(index=False)


def write_outputs(
    out: Path,
    results: Sequence[SimResult],
    summary: pd.DataFrame,
    *,
    title: str,
    notes: str = "",
) -> list[Path]:
    """Write summary.csv, jobs.csv and report.html into ``out``; returns their paths."""
    from scheduler.report import write_report

    out.mkdir(parents=True, exist_ok=True)
    jobs = pd.concat([r.jobs_frame() for r in results], ignore_index=True)
    timeline = pd.concat([r.timeline_frame() for r in results], ignore_index=True)
    samples = pd.concat([r.slowdown_frame() for r in results], ignore_index=True)
    paths = [out / "summary.csv", out / "jobs.csv"]
    summary.to_csv(paths[0], index=False)
    jobs.to_csv(paths[1], index=False)
    gpu_count = results[0].gpu_count if results else 0
    paths.append(
        write_report(
            out / "report.html",
            title=title,
            summary=summary,
            jobs=jobs,
            timeline=timeline,
            samples=samples,
            gpu_count=gpu_count,
            notes=notes,
        )
    )
    return paths


if __name__ == "__main__":
    sys.exit(main())
