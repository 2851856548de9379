"""EASY reservations (the framework's ``reserve`` parameter) on and off, on two multi-GPU traces.

docs/policies.md ("Reservations") describes the comparison and its results.

    python -m scheduler.reproduce reserve [--out DIR]

Traces, both on the ``philly_multigpu`` scenario's cluster (3 nodes x 4 GPUs of each of K80,
P100, V100), its simulation settings and the measured interference table:

- ``philly_multigpu``: the scenario's trace (500 jobs, Gavel's settings, seed 0);
- ``gavel_multigpu_seed1``: the same generator and settings (``python -m scheduler.traces
  generate --jobs 500 --multi-gpu --seed 1 --jobs-per-hour 0.5``), another seed: a trace kept
  aside, generated here in a temporary directory (same arguments, same jobs).

Policies (``POLICIES``): the backfilling framework policies and ``fifo`` with ``backfill`` on,
each with ``reserve`` off and on (nothing else changed). Per run: jobs completed of the total
(an incomplete run has no average JCT or makespan, as in ``scheduler.metrics``), average JCT,
makespan, average queueing delay, and the mean and worst queueing delay of the jobs of 8 GPUs
or more.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints

from scheduler.domain import JobSpec
from scheduler.interference import build_interference
from scheduler.metrics import summarize
from scheduler.policies.registry import build_policy
from scheduler.simulator import simulate

POLICIES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("fifo (backfill on)", "fifo", {"backfill": True}),
    ("binpack", "binpack", {}),
    ("loadbalance", "loadbalance", {}),
    ("mystic", "mystic", {}),
    ("placement_rate", "placement_rate", {}),
    ("random", "random", {}),
)
BIG_GPUS = 8  # "large" jobs: 8 GPUs or more (gangs over two 4-GPU nodes here)
SEED1_ARGS: dict[str, Any] = {"jobs": 500, "multi_gpu": True, "seed": 1, "jobs_per_hour": 0.5}


def seed1_jobs() -> list[JobSpec]:
    """The kept-aside trace: Gavel's settings, seed 1 (module docstring)."""
    from scheduler.trace_generator import generate_jobs, write_gavel_trace
    from scheduler.traces import read_gavel_trace

    args = dict(SEED1_ARGS)
    count = int(args.pop("jobs"))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gavel_multigpu_500jobs_seed1.csv"
        write_gavel_trace(generate_jobs(count, **args), path)
        return read_gavel_trace(path)


def run_reservations(
    progress: Callable[[str], None] | None = None,
    traces: Sequence[str] = ("philly_multigpu", "gavel_multigpu_seed1"),
    policies: Sequence[tuple[str, str, dict[str, Any]]] = POLICIES,
) -> pd.DataFrame:
    """One row per (trace, policy, reserve): the figures of the module docstring."""
    from scheduler.scenarios import load_scenario

    sc = load_scenario("philly_multigpu")
    model = build_interference(sc.interference)
    rows = []
    for trace in traces:
        jobs = list(sc.jobs) if trace == "philly_multigpu" else seed1_jobs()
        for label, name, params in policies:
            for reserve in (False, True):
                if progress is not None:
                    progress(f"reserve: {trace}, {label}, reserve {reserve}")
                policy = build_policy(name, {**params, "reserve": reserve})
                result = simulate(sc.cluster, jobs, policy, interference=model, config=sc.config)
                summary = summarize(result)
                waits = [
                    r.start_s - r.arrival_s
                    for r in result.jobs
                    if r.gpus >= BIG_GPUS and r.start_s is not None
                ]
                big = sum(1 for j in jobs if j.gpus >= BIG_GPUS)
                rows.append(
                    {
                        "trace": trace,
                        "policy": label,
                        "reserve": reserve,
                        "status": summary["status"],
                        "completed": summary["completed"],
                        "jobs": summary["jobs"],
                        "avg_jct_s": summary["avg_jct_s"],
                        "makespan_s": summary["makespan_s"],
                        "avg_queue_s": summary["avg_queue_s"],
                        "big_jobs": big,
                        "big_started": len(waits),
                        "big_mean_wait_s": sum(waits) / len(waits) if waits else None,
                        "big_worst_wait_s": max(waits) if waits else None,
                    }
                )
    return pd.DataFrame(rows)


def summarize_reservations(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs side by side: per trace and policy, off and on, and on / off of the JCT and
    the worst wait of the large jobs."""
    off = runs[~runs.reserve].set_index(["trace", "policy"])
    on = runs[runs.reserve].set_index(["trace", "policy"])
    out = pd.DataFrame(index=off.index)
    for col in ("completed", "avg_jct_s", "makespan_s", "big_mean_wait_s", "big_worst_wait_s"):
        out[f"{col}_off"] = off[col]
        out[f"{col}_on"] = on[col]
    out["jct_on_over_off"] = on.avg_jct_s / off.avg_jct_s
    out["big_worst_on_over_off"] = on.big_worst_wait_s / off.big_worst_wait_s
    return out.reset_index()
