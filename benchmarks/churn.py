"""Churn and cycle time of the preemptive policy at scale, and a 100,000-job replay (issue 24).

    python -m benchmarks churn [--quick]

**Cycle.** 10,000 nodes x 8 GPUs (80,000 GPUs, K80/P100/V100/A100 by node), every GPU busy
with a single-GPU job that has done 0-90 % of its work (``decision_latency.build_busy_state``),
and 1,000, then 10,000 pending jobs. One ``hetero_srtf`` cycle (a fresh policy object, as the
first cycle of a loop; restart cost 60 s) is timed with ``time.perf_counter``; the churn is the
share of running jobs it requeues (``REQUEUE`` actions, moves included) in that cycle. Goals:
<= 1 s per cycle and <= 2 % of running jobs requeued per cycle.

**Replay.** 100,000 generated Gavel-type jobs at an offered load of 0.8
(``simulator_throughput.make_trace``) on 8,000 GPUs, replayed under ``hetero_srtf`` in a child
process, twice: with the simulator's defaults (decisions on every arrival and completion; its
knowledge fed as usual), and with decisions every 360 s (``SimConfig.round_s``, the rounds of
the peers' comparison and of Gavel). Goal: < 120 s wall time. A replay still running after
``REPLAY_LIMIT_S`` (five times the goal) is stopped at its next job end and reported as not
finished, with the jobs done and the simulated time reached. ``--quick``: 800 GPUs, 100 /
1,000 pending; 5,000 jobs on 800 GPUs.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scheduler.domain import ActionKind

CYCLE_GOAL_S = 1.0
CHURN_GOAL = 0.02
REPLAY_GOAL_S = 120.0
REPLAY_LIMIT_S = 5 * REPLAY_GOAL_S
#: Decision rounds of the second replay (None: decisions on events).
REPLAY_ROUNDS: tuple[float | None, ...] = (None, 360.0)
FULL = {"gpus": 80_000, "pending": (1_000, 10_000), "replay_jobs": 100_000, "replay_gpus": 8_000}
QUICK = {"gpus": 800, "pending": (100, 1_000), "replay_jobs": 5_000, "replay_gpus": 800}


def cycle_row(gpus: int, pending: int) -> dict[str, Any]:
    from benchmarks.decision_latency import build_busy_state
    from scheduler.policies.registry import build_policy

    t0 = time.perf_counter()
    state = build_busy_state(gpus, pending)
    built = time.perf_counter() - t0
    policy = build_policy("hetero_srtf", {"preemption_cost_s": 60.0})
    t0 = time.perf_counter()
    plan = policy.schedule(state, random.Random(0))
    cycle = time.perf_counter() - t0
    requeued = sum(1 for a in plan.actions if a.kind == ActionKind.REQUEUE)
    running = len(state.running)
    return {
        "gpus": gpus,
        "pending": pending,
        "running": running,
        "cycle_s": cycle,
        "requeued": requeued,
        "requeued_share": requeued / max(1, running),
        "placed": len(plan.decisions),
        "snapshot_build_s": built,
    }


def replay_rows(
    jobs: int,
    gpus: int,
    rounds: Sequence[float | None] = REPLAY_ROUNDS,
    limit_s: float | None = REPLAY_LIMIT_S,
) -> list[dict[str, Any]]:
    """The replay's figures (``simulator_throughput.replay``) of one trace, once per decision
    round of ``rounds`` (None: on events); each stopped after ``limit_s`` of wall time if still
    running (None: no limit)."""
    from benchmarks.simulator_throughput import make_trace, replay_in_child

    with tempfile.TemporaryDirectory(prefix="cosched-churn-") as tmp:
        trace = Path(tmp) / "trace.csv"
        make_trace(trace, jobs, gpus)
        return [
            replay_in_child(str(trace), gpus, "hetero_srtf", limit_s=limit_s, round_s=round_s)
            for round_s in rounds
        ]


def run(quick: bool = False) -> dict:
    sizes = QUICK if quick else FULL
    rows = []
    for pending in sizes["pending"]:
        print(f"  cycle: {sizes['gpus']:,} GPUs busy, {pending:,} pending ...", file=sys.stderr)
        rows.append(cycle_row(int(sizes["gpus"]), int(pending)))
    print(f"{'GPUs':>8}{'pending':>9}{'running':>9}{'cycle s':>9}{'requeued':>10}{'share':>8}")
    for r in rows:
        print(
            f"{r['gpus']:>8,}{r['pending']:>9,}{r['running']:>9,}{r['cycle_s']:>9.2f}"
            f"{r['requeued']:>10,}{r['requeued_share']:>8.2%}"
        )
    summary: dict[str, Any] = {}
    for r in rows:
        summary[f"cycle s, {r['pending']:,} pending"] = round(r["cycle_s"], 3)
        summary[f"requeued % per cycle, {r['pending']:,} pending"] = round(
            100 * r["requeued_share"], 3
        )
    print(
        f"  replay: {sizes['replay_jobs']:,} jobs on {sizes['replay_gpus']:,} GPUs, on events "
        "and in rounds ...",
        file=sys.stderr,
    )
    replays = replay_rows(int(sizes["replay_jobs"]), int(sizes["replay_gpus"]))
    for round_s, rep in zip(REPLAY_ROUNDS, replays, strict=True):
        how = "decisions on events" if round_s is None else f"{round_s:g}-s rounds"
        print(f"replay ({how}): {rep}")
        label = f"replay s, {sizes['replay_jobs']:,} jobs, {how}"
        if rep.get("finished"):
            summary[label] = round(rep["wall_s"], 1)
        elif "jobs_done" in rep:
            summary[label] = (
                f"not finished in {rep['wall_s']:.0f} s ({rep['jobs_done']:,} jobs done, "
                f"{rep['sim_s'] / 86400:.1f} simulated days)"
            )
        else:
            summary[label] = rep.get("error", "failed")
    ok_cycle = all(r["cycle_s"] <= CYCLE_GOAL_S for r in rows)
    ok_churn = all(r["requeued_share"] <= CHURN_GOAL for r in rows)
    summary["goals (cycle, churn)"] = f"{'met' if ok_cycle else 'NOT met'}, " + (
        "met" if ok_churn else "NOT met"
    )
    if not quick:
        summary[f"goal replay < {REPLAY_GOAL_S:g} s (events, rounds)"] = ", ".join(
            "met" if r.get("finished") and r["wall_s"] < REPLAY_GOAL_S else "NOT met"
            for r in replays
        )
    return {"cycles": rows, "replay": replays[0], "replays": replays, "summary": summary}
