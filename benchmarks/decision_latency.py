"""Scheduling-decision latency of every registered policy, as the cluster and the queue grow.

    python -m benchmarks.decision_latency [--quick]

Definition. One *cycle* is one ``policy.schedule(state, rng)`` call on a frozen snapshot, timed
with ``time.perf_counter`` (the pure core only: no database, no I/O). Every pending job gets an
answer in a cycle (a placement, or a reason to wait), so the *per-job decision latency* is the
cycle's wall time divided by the number of pending jobs. Each point is the median over
``repeats`` cycles on the same snapshot with a fresh ``random.Random(0)`` each time, after one
warm-up cycle per policy (which loads the measured tables the filter and ``mystic`` read).

Two figures per point. *Cold* (the headline): a new policy object each cycle (built outside the
timed call), so the cycle indexes the whole cluster, as the first cycle of a scheduling loop
does. *Warm*: the same object cycle after cycle; the framework keeps its working view and
re-indexes only the nodes the previous cycle reserved on (its plan was not applied here), the
steady state of the live loop and of the simulator, where few nodes change between cycles.

Snapshots are generated deterministically (``build_state``):

- nodes of up to 8 GPUs, 64 cores each, GPU models K80, P100, V100, A100 in turn by node;
- about 40 % of the GPUs idle, 35 % running one job exclusively, 25 % shared by one job (MPS
  where the GPU supports it, else time-slicing), so co-locating policies see shared GPUs;
- jobs of the 26 Gavel job types (their solo times from ``data/gavel/solo_throughput.csv``;
  A100, which Gavel did not measure, at the V100 time / 1.7), each type with a fixed GPU memory
  need (1 to 12 GB) and utilisation metrics drawn once from a seeded generator, so that
  ``loadbalance`` and ``mystic`` have something to read; pending jobs ask 1 GPU (85 %), 2
  (10 %) or 4 (5 %), and 1 to 4 cores.

Goal (issue 3): median per-job decision < 5 ms at 1,000 nodes x 8 GPUs with 1,000 pending jobs.

**Preemption case** (issue 13): every GPU of the 1,000 nodes x 8 GPUs runs a single-GPU job
(under MPS where the GPU has it) that has done a uniform 0-90 % of its work and arrived up to
10 h before; 1,000 pending jobs as above. A preemptive policy (one that takes a
``preemption_cost_s`` parameter: ``hetero_srtf``) re-plans the whole cluster: which running jobs
to requeue or move and where the pending ones go. Same goal; quick mode at 800 GPUs, 60 pending.

**Gang case** (issue 10): the same 1,000 nodes x 8 GPUs, 1,000 pending jobs of which every third
is a gang of 8, 16, 24 or 32 GPUs (in turn; an 8-GPU job fits one node and waits for a whole
idle one, the others span 2 to 4 nodes of one model), the rest drawn as above. Same goal:
median per-job decision < 5 ms for every policy. Quick mode runs it at 800 GPUs with 60 pending.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from scheduler.catalog import gpu_spec
from scheduler.domain import (
    ClusterState,
    GpuState,
    JobKind,
    JobSpec,
    NodeKind,
    NodeState,
    Placement,
    Profile,
    RunningJob,
    SharingMode,
)
from scheduler.policies.registry import available_policies, build_policy
from scheduler.traces import load_solo_throughputs

GOAL_MS = 5.0
GOAL_GPUS = 8_000  # 1,000 nodes x 8 GPUs
GOAL_PENDING = 1_000
MODELS = ("K80", "P100", "V100", "A100")
GPUS_PER_NODE = 8
CORES_PER_NODE = 64
A100_SPEEDUP_OVER_V100 = 1.7

GANG_SIZES = (8, 16, 24, 32)
GANG_EVERY = 3  # every third pending job is a gang

FULL = {
    "cluster_gpus": (10, 100, 1_000, 8_000),
    "cluster_pending": 1_000,
    "queue_pending": (10, 100, 1_000, 10_000),
    "queue_gpus": 8_000,
    "gang_point": (8_000, 1_000),
    "preempt_point": (8_000, 1_000),
    "repeats": 5,
}
QUICK = {
    "cluster_gpus": (10, 100),
    "cluster_pending": 100,
    "queue_pending": (10, 100),
    "queue_gpus": 100,
    "gang_point": (800, 60),
    "preempt_point": (800, 60),
    "repeats": 3,
}


def job_profiles(seed: int = 7) -> list[tuple[Profile, str]]:
    """(profile, job_type) for every Gavel job type at scale factor 1, with a GPU memory need
    and utilisation metrics drawn once from ``seed``."""
    rng = random.Random(seed)
    out = []
    table = load_solo_throughputs()
    for (job_type, scale), tputs in sorted(table.items()):
        if scale != 1 or not tputs:
            continue
        steps = 1000.0 * rng.uniform(1.0, 50.0)
        times = {model: steps / t for model, t in tputs.items()}
        if "V100" in times:
            times["A100"] = times["V100"] / A100_SPEEDUP_OVER_V100
        util = rng.uniform(20.0, 98.0)
        profile = Profile(
            name=job_type,
            kind=JobKind.DL_TRAIN,
            gpu_time_s=times,
            gpu_memory_max_mb=1024.0 * rng.randint(1, 12),
            gpu_util_pct=util,
            sm_efficiency_pct=min(100.0, util * rng.uniform(0.7, 1.1)),
            ipc=rng.uniform(0.3, 3.5),
            occupancy_pct=rng.uniform(10.0, 90.0),
            mem_util_pct=rng.uniform(5.0, 90.0),
            gld_gbps=rng.uniform(20.0, 600.0),
            gst_gbps=rng.uniform(5.0, 200.0),
        )
        out.append((profile, job_type))
    return out


def _job(
    job_id: str, rng: random.Random, kinds: Sequence[tuple[Profile, str]], gpus: int
) -> JobSpec:
    profile, job_type = rng.choice(kinds)
    return JobSpec(
        id=job_id,
        kind=JobKind.DL_TRAIN,
        gpus=gpus,
        cpus=rng.randint(1, 4),
        profile=profile,
        job_type=job_type,
    )


def build_state(gpus: int, pending: int, seed: int = 7, *, gangs: bool = False) -> ClusterState:
    """A snapshot with ``gpus`` GPUs (nodes of up to 8) and ``pending`` queued jobs (module
    docstring); with ``gangs`` every third pending job asks 8, 16, 24 or 32 GPUs in turn. The
    same arguments always give the same snapshot."""
    rng = random.Random(seed * 1_000_003 + gpus * 31 + pending)
    kinds = job_profiles(seed)
    nodes: list[NodeState] = []
    running: list[RunningJob] = []
    left = gpus
    n = 0
    while left > 0:
        count = min(GPUS_PER_NODE, left)
        left -= count
        name = f"n{n:04d}"
        spec = gpu_spec(MODELS[n % len(MODELS)])
        shared_mode = (
            SharingMode.MPS if spec.supports(SharingMode.MPS) else (SharingMode.TIME_SLICING)
        )
        used_cores = 0
        states = []
        for i in range(count):
            draw = rng.random()
            if draw < 0.40:
                states.append(GpuState(node=name, index=i, spec=spec))
                continue
            resident = _job(f"run-{name}-{i}", rng, kinds, 1)
            if resident.memory_need_mb() > spec.memory_mb:
                states.append(GpuState(node=name, index=i, spec=spec))
                continue
            mode = SharingMode.EXCLUSIVE if draw < 0.75 else shared_mode
            used_cores += resident.cpus
            states.append(
                GpuState(
                    node=name,
                    index=i,
                    spec=spec,
                    mode=mode,
                    job_ids=(resident.id,),
                    committed_memory_mb=resident.memory_need_mb(),
                )
            )
            running.append(
                RunningJob(
                    resident,
                    Placement(resident.id, name, (i,), mode, cpus=resident.cpus),
                    started_s=0.0,
                )
            )
        nodes.append(
            NodeState(
                name,
                NodeKind.GPU,
                CORES_PER_NODE,
                CORES_PER_NODE - used_cores,
                gpus=tuple(states),
            )
        )
        n += 1
    queue = []
    for k in range(pending):
        draw = rng.random()
        size = 1 if draw < 0.85 else (2 if draw < 0.95 else 4)
        if gangs and k % GANG_EVERY == GANG_EVERY - 1:
            size = GANG_SIZES[(k // GANG_EVERY) % len(GANG_SIZES)]
        queue.append(_job(f"p{k:05d}", rng, kinds, size))
    return ClusterState(now_s=0.0, nodes=tuple(nodes), pending=tuple(queue), running=tuple(running))


def build_busy_state(gpus: int, pending: int, seed: int = 7) -> ClusterState:
    """The preemption case (module docstring): every GPU busy with a job in progress."""
    rng = random.Random(seed * 7_919 + gpus + pending)
    kinds = job_profiles(seed)
    base = build_state(gpus, pending, seed)
    nodes: list[NodeState] = []
    running: list[RunningJob] = []
    for node in base.nodes:
        states = []
        for g in node.gpus:
            job = _job(f"run-{node.name}-{g.index}", rng, kinds, 1)
            job = JobSpec(
                id=job.id,
                kind=job.kind,
                gpus=1,
                cpus=1,
                profile=job.profile,
                job_type=job.job_type,
                arrival_s=-rng.uniform(0.0, 36_000.0),
            )
            mode = SharingMode.MPS if g.spec.supports(SharingMode.MPS) else SharingMode.EXCLUSIVE
            states.append(
                GpuState(
                    node=node.name,
                    index=g.index,
                    spec=g.spec,
                    mode=mode,
                    job_ids=(job.id,),
                    committed_memory_mb=job.memory_need_mb(),
                )
            )
            running.append(
                RunningJob(
                    job,
                    Placement(job.id, node.name, (g.index,), mode, cpus=1),
                    started_s=job.arrival_s,
                    progress=rng.uniform(0.0, 0.9),
                )
            )
        nodes.append(
            NodeState(
                node.name,
                NodeKind.GPU,
                CORES_PER_NODE,
                CORES_PER_NODE - len(states),
                gpus=tuple(states),
            )
        )
    return ClusterState(now_s=0.0, nodes=tuple(nodes), pending=base.pending, running=tuple(running))


def preemptive_policies(policies: Sequence[str]) -> list[str]:
    """The policies that take a ``preemption_cost_s`` parameter."""
    from scheduler.policies.registry import policy_defaults

    return [p for p in policies if "preemption_cost_s" in policy_defaults(p)]


def gang_rows(
    gpus: int, pending: int, policies: Sequence[str], repeats: int
) -> list[dict[str, Any]]:
    """The gang case (module docstring) for every policy; rows add ``gangs`` (pending gangs)
    and ``gangs_placed`` (placed over several nodes)."""
    state = build_state(gpus, pending, gangs=True)
    gangs = sum(1 for j in state.pending if j.gpus >= GANG_SIZES[0])
    rows = []
    for name in policies:
        try:
            row = time_policy(name, state, repeats)
            row["gangs"] = gangs
        except Exception as exc:  # a broken policy must not hide the others' figures
            row = {"policy": name, "gpus": gpus, "pending": pending, "error": f"{exc!r}"}
        rows.append(row)
    return rows


def time_policy(name: str, state: ClusterState, repeats: int) -> dict[str, Any]:
    """Median cycle time and per-job latency of policy ``name`` on ``state``, cold (a new
    policy object per cycle) and warm (one object reused)."""
    cycles = []
    placed = spread = moved = preempted = 0
    queued = {j.id for j in state.pending}
    for _ in range(repeats):
        policy = build_policy(name)
        t0 = time.perf_counter()
        plan = policy.schedule(state, random.Random(0))
        cycles.append(time.perf_counter() - t0)
        # Pending jobs placed; a preemptive policy may also move running jobs (requeue and
        # place again in one plan) or requeue them.
        placed = sum(1 for d in plan.decisions if d.placement.job_id in queued)
        moved = len(plan.decisions) - placed
        preempted = len(plan.actions)
        spread = sum(1 for d in plan.decisions if d.placement.is_gang)
    warm = []
    policy = build_policy(name)
    policy.schedule(state, random.Random(0))
    for _ in range(repeats):
        t0 = time.perf_counter()
        policy.schedule(state, random.Random(0))
        warm.append(time.perf_counter() - t0)
    cycle = statistics.median(cycles)
    jobs = max(1, len(state.pending))
    return {
        "policy": name,
        "gpus": sum(len(node.gpus) for node in state.nodes),
        "nodes": len(state.nodes),
        "pending": len(state.pending),
        "placed": placed,
        "gangs_placed": spread,
        "moved": moved,
        "actions": preempted,
        "cycle_ms": 1000.0 * cycle,
        "per_job_ms": 1000.0 * cycle / jobs,
        "per_job_ms_max": 1000.0 * max(cycles) / jobs,
        "warm_cycle_ms": 1000.0 * statistics.median(warm),
        "warm_per_job_ms": 1000.0 * statistics.median(warm) / jobs,
        "repeats": repeats,
    }


def _sweep(
    points: Sequence[tuple[int, int]],
    policies: Sequence[str],
    repeats: int,
    measured: dict[tuple[int, int, str], dict[str, Any]],
) -> list[dict[str, Any]]:
    """Rows for every (GPUs, pending) point and policy; a point already in ``measured`` (the
    goal point is in both sweeps) is reported, not timed again."""
    rows = []
    for gpus, pending in points:
        state = None
        for name in policies:
            key = (gpus, pending, name)
            if key not in measured:
                state = state or build_state(gpus, pending)
                try:
                    measured[key] = time_policy(name, state, repeats)
                except Exception as exc:  # a broken policy must not hide the others' figures
                    measured[key] = {
                        "policy": name,
                        "gpus": gpus,
                        "pending": pending,
                        "error": f"{type(exc).__name__}: {exc}",
                    }
            rows.append(measured[key])
    return rows


def _warm_up(policies: Sequence[str]) -> None:
    state = build_state(16, 16)
    for name in policies:
        with contextlib.suppress(Exception):  # reported by the sweep itself
            build_policy(name).schedule(state, random.Random(0))


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """A fixed-width table of sweep rows."""
    head = (
        f"{'policy':<14}{'GPUs':>7}{'nodes':>7}{'pending':>9}{'placed':>8}"
        f"{'cycle ms':>11}{'ms/job':>9}{'warm cycle':>12}{'warm/job':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(
                f"{r['policy']:<14}{r['gpus']:>7}{'':>7}{r['pending']:>9}  error: {r['error']}"
            )
            continue
        lines.append(
            f"{r['policy']:<14}{r['gpus']:>7,}{r['nodes']:>7,}{r['pending']:>9,}"
            f"{r['placed']:>8,}{r['cycle_ms']:>11.1f}{r['per_job_ms']:>9.3f}"
            f"{r['warm_cycle_ms']:>12.1f}{r['warm_per_job_ms']:>10.3f}"
        )
    return "\n".join(lines)


def run(quick: bool = False) -> dict:
    """Run both sweeps, print the tables and return the figures (see the module docstring)."""
    sizes = QUICK if quick else FULL
    policies = available_policies()
    repeats = int(sizes["repeats"])
    _warm_up(policies)
    measured: dict[tuple[int, int, str], dict[str, Any]] = {}
    cluster_rows = _sweep(
        [(g, int(sizes["cluster_pending"])) for g in sizes["cluster_gpus"]],
        policies,
        repeats,
        measured,
    )
    print(
        f"Decision latency as the cluster grows ({sizes['cluster_pending']:,} pending jobs; "
        f"median of {repeats} cycles; cold = new policy object, warm = reused)"
    )
    print(format_rows(cluster_rows))
    queue_rows = _sweep(
        [(int(sizes["queue_gpus"]), p) for p in sizes["queue_pending"]], policies, repeats, measured
    )
    print()
    print(
        f"Decision latency as the queue grows ({sizes['queue_gpus']:,} GPUs; "
        f"median of {repeats} cycles; cold = new policy object, warm = reused)"
    )
    print(format_rows(queue_rows))

    gang_gpus, gang_pending = sizes["gang_point"]
    gang = gang_rows(int(gang_gpus), int(gang_pending), policies, repeats)
    print()
    print(
        f"Gang case: {gang_gpus:,} GPUs, {gang_pending:,} pending, every {GANG_EVERY}rd a gang "
        f"of {'/'.join(map(str, GANG_SIZES))} GPUs (median of {repeats} cycles)"
    )
    print(format_rows(gang))
    print(
        "gangs placed over several nodes: "
        + ", ".join(f"{r['policy']} {r['gangs_placed']}" for r in gang if "error" not in r)
    )
    gang_goal = {r["policy"]: r["per_job_ms"] for r in gang if "error" not in r}
    gang_met = len(gang_goal) == len(gang) and all(v < GOAL_MS for v in gang_goal.values())
    if not quick:
        worst = max(gang_goal, key=lambda p: gang_goal[p]) if gang_goal else None
        print(
            f"Gang goal (< {GOAL_MS:g} ms per job): {'met' if gang_met else 'NOT met'}"
            + (f"; slowest {worst}, {gang_goal[worst]:.3f} ms/job" if worst else "")
        )

    pre_gpus, pre_pending = sizes["preempt_point"]
    busy_state = build_busy_state(int(pre_gpus), int(pre_pending))
    preempt = []
    for name in preemptive_policies(policies):
        try:
            row = time_policy(name, busy_state, repeats)
        except Exception as exc:  # a broken policy must not hide the others' figures
            row = {"policy": name, "gpus": pre_gpus, "pending": pre_pending, "error": f"{exc!r}"}
        preempt.append(row)
    print()
    print(
        f"Preemption case: {pre_gpus:,} GPUs all busy with jobs in progress, "
        f"{pre_pending:,} pending (median of {repeats} cycles)"
    )
    print(format_rows(preempt))

    goal: dict[str, Any] = {}
    for r in (*cluster_rows, *queue_rows):
        if r.get("gpus") == GOAL_GPUS and r.get("pending") == GOAL_PENDING and "error" not in r:
            goal[r["policy"]] = r["per_job_ms"]
    print()
    if goal:
        slow = {p: v for p, v in goal.items() if v >= GOAL_MS}
        worst = max(goal, key=lambda p: goal[p])
        if not slow:
            print(
                f"Goal (median decision < {GOAL_MS:g} ms per job at 1,000 nodes x 8 GPUs, "
                f"1,000 pending): met by every policy; slowest {worst}, "
                f"{goal[worst]:.3f} ms/job"
            )
        else:
            print(
                f"Goal (< {GOAL_MS:g} ms per job at 1,000 nodes x 8 GPUs, 1,000 pending) NOT "
                "met by: " + ", ".join(f"{p} {v:.3f} ms/job" for p, v in slow.items())
            )
    else:
        print("Goal point (8,000 GPUs, 1,000 pending) not measured in this (quick) run.")
    summary: dict[str, Any] = {}
    largest = max((r["gpus"], r["pending"]) for r in cluster_rows)
    for r in cluster_rows:
        if "error" in r:
            continue
        if (r["gpus"], r["pending"]) == largest:
            summary[f"{r['policy']} ms/job @ {r['gpus']:,} GPUs, {r['pending']:,} queued"] = round(
                r["per_job_ms"], 4
            )
    goal_met = bool(goal) and all(v < GOAL_MS for v in goal.values())
    summary[f"goal < {GOAL_MS:g} ms/job @ 8,000 GPUs, 1,000 queued"] = (
        ("met" if goal_met else "NOT met") if goal else "not measured (quick)"
    )
    for r in gang:
        if "error" not in r:
            summary[f"{r['policy']} ms/job, gang case"] = round(r["per_job_ms"], 4)
    summary[f"gang goal < {GOAL_MS:g} ms/job @ {gang_gpus:,} GPUs, {gang_pending:,} queued"] = (
        "met" if gang_met else "NOT met"
    )
    for r in preempt:
        if "error" not in r:
            summary[f"{r['policy']} ms/job, preemption case @ {pre_gpus:,} GPUs"] = round(
                r["per_job_ms"], 4
            )
    return {
        "definition": "median over repeats of one policy.schedule() wall time / pending jobs",
        "goal_ms": GOAL_MS,
        "goal_per_job_ms": goal,
        "goal_met": goal_met,
        "cluster_sweep": cluster_rows,
        "queue_sweep": queue_rows,
        "gang_case": gang,
        "gang_goal_met": gang_met,
        "preemption_case": preempt,
        "summary": summary,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.decision_latency", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes only (seconds)")
    args = parser.parse_args(argv)
    run(quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
