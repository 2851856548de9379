"""Decision latency of the GPU-sharing policies on snapshots where their own paths run.

    python -m benchmarks.sharing_latency [--quick]

``benchmarks.decision_latency`` times every registered policy on Gavel training jobs, which
have no scale, sensitivity, C/M class or kernel profile: ``sharing_mode`` then sees only
defaults and ``kscheduler`` runs every job alone. This benchmark builds snapshots that exercise
what those policies do (same definition of a cycle and of per-job latency: median over
``repeats`` cycles of one ``policy.schedule`` call / pending jobs, cold = a new policy object
per cycle):

- **sharing**: nodes of 8 GPUs cycling TitanXp, RTX2080Ti, A30, A100 (A30 and A100 in MIG with
  a layout, some instances in use); about 40 % idle GPUs, the rest shared by one job of one of
  20 owners (MPS on the RTX 2080 Ti, time-slicing on the Titan Xp, MIG on the A30 / A100);
  pending jobs are paper 001's 30 applications (``sharing001`` profiles) of random owners.
  Policies: sharing_mode, byscale, sharing_random, sharing_pipeline, sharing_chain.
- **kernels**: nodes of 8 Titan Xp GPUs (thread limit on, as in ``kscheduler003``), 40 % busy
  with a kernel group; pending jobs are Table 7's 18 kernels in turn, of 20 owners. Policies:
  kscheduler, warped_slicer, even_partition.

Goal (issue 15): median per-job decision < 5 ms at 1,000 nodes x 8 GPUs with 1,000 pending.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from scheduler.catalog import gpu_spec
from scheduler.domain import (
    ClusterState,
    GpuState,
    JobSpec,
    NodeKind,
    NodeState,
    Placement,
    RunningJob,
    SharingMode,
)
from scheduler.kernels import kernel_profiles
from scheduler.policies.registry import build_policy
from scheduler.scenarios import SCENARIO_DIR
from scheduler.traces import load_profiles

GOAL_MS = 5.0
SHARING_POLICIES = (
    "sharing_mode",
    "byscale",
    "sharing_random",
    "sharing_pipeline",
    "sharing_chain",
)
KERNEL_POLICIES = ("kscheduler", "warped_slicer", "even_partition")
OWNERS = 20
FULL: dict[str, Any] = {"gpus": (1_000, 8_000), "pending": 1_000, "repeats": 3}
QUICK: dict[str, Any] = {"gpus": (100,), "pending": 100, "repeats": 2}
_MIG_LAYOUT: dict[str, tuple[str, ...]] = {
    "A30": ("2g.12gb", "1g.6gb", "1g.6gb"),
    "A100": ("3g.20gb", "2g.10gb", "2g.10gb"),
}
_SHARED = {
    "TitanXp": SharingMode.TIME_SLICING,
    "RTX2080Ti": SharingMode.MPS,
    "A30": SharingMode.MIG,
    "A100": SharingMode.MIG,
}


def sharing_state(gpus: int, pending: int, seed: int = 7) -> ClusterState:
    """The *sharing* snapshot (module docstring); same arguments, same snapshot."""
    rng = random.Random(seed * 7919 + gpus + pending)
    profiles = list(load_profiles(SCENARIO_DIR / "profiles" / "sharing001.yaml").values())
    profiles = [
        replace(p, gpu_time_s={**p.gpu_time_s, "A100": p.gpu_time_s["A30"] / 1.3}) for p in profiles
    ]
    models = ("TitanXp", "RTX2080Ti", "A30", "A100")
    nodes, running = [], []
    n = 0
    while gpus > 0:
        count = min(8, gpus)
        gpus -= count
        name = f"n{n:04d}"
        model = models[n % len(models)]
        spec = gpu_spec(model)
        states = []
        for i in range(count):
            layout = _MIG_LAYOUT.get(model, ())
            if rng.random() < 0.4:
                states.append(GpuState(node=name, index=i, spec=spec, mig_layout=layout))
                continue
            mode = _SHARED[model]
            profile = rng.choice(profiles)
            mig = layout[0] if mode == SharingMode.MIG else None
            job = JobSpec(
                id=f"r-{name}-{i}",
                profile=profile,
                owner=f"u{rng.randrange(OWNERS)}",
                gpu_memory_mb=min(profile.gpu_memory_max_mb or 0.0, 5000.0),
            )
            slices = spec.mig_profile(mig).compute_slices if mig else 0  # type: ignore[union-attr]
            states.append(
                GpuState(
                    node=name,
                    index=i,
                    spec=spec,
                    mode=mode,
                    job_ids=(job.id,),
                    committed_memory_mb=job.memory_need_mb(),
                    mig_slices_used=slices,
                    mig_layout=layout,
                )
            )
            running.append(
                RunningJob(job, Placement(job.id, name, (i,), mode, mig_profile=mig), 0.0)
            )
        nodes.append(NodeState(name, NodeKind.GPU, 64, 64 - 8, gpus=tuple(states)))
        n += 1
    queue = tuple(
        JobSpec(id=f"p{k:05d}", profile=rng.choice(profiles), owner=f"u{rng.randrange(OWNERS)}")
        for k in range(pending)
    )
    return ClusterState(0.0, tuple(nodes), queue, tuple(running))


def kernel_state(gpus: int, pending: int, seed: int = 7) -> ClusterState:
    """The *kernels* snapshot (module docstring)."""
    rng = random.Random(seed * 104729 + gpus + pending)
    kernels = list(kernel_profiles().values())
    spec = replace(gpu_spec("TitanXp"), sharing_modes=(SharingMode.EXCLUSIVE, SharingMode.MPS))
    spec = replace(spec, mps_thread_limit=True)
    nodes, running = [], []
    n = 0
    while gpus > 0:
        count = min(8, gpus)
        gpus -= count
        name = f"k{n:04d}"
        states = []
        for i in range(count):
            if rng.random() < 0.6:
                states.append(GpuState(node=name, index=i, spec=spec))
                continue
            group = [
                JobSpec(id=f"r-{name}-{i}-{m}", profile=rng.choice(kernels), owner="u0")
                for m in range(2)
            ]
            states.append(
                GpuState(
                    node=name,
                    index=i,
                    spec=spec,
                    mode=SharingMode.MPS,
                    job_ids=tuple(j.id for j in group),
                    committed_memory_mb=sum(j.memory_need_mb() for j in group),
                )
            )
            running += [
                RunningJob(j, Placement(j.id, name, (i,), SharingMode.MPS, mps_percentage=40), 0.0)
                for j in group
            ]
        nodes.append(NodeState(name, NodeKind.GPU, 64, 64 - 8, gpus=tuple(states)))
        n += 1
    queue = tuple(
        JobSpec(id=f"p{k:05d}", profile=kernels[k % len(kernels)], owner=f"u{k % OWNERS}")
        for k in range(pending)
    )
    return ClusterState(0.0, tuple(nodes), queue, tuple(running))


def time_policy(name: str, state: ClusterState, repeats: int) -> dict[str, Any]:
    """Median cold cycle and per-job latency of ``name`` on ``state``."""
    cycles, placed = [], 0
    for _ in range(repeats):
        policy = build_policy(name, {"max_jobs_per_gpu": 4})
        t0 = time.perf_counter()
        plan = policy.schedule(state, random.Random(0))
        cycles.append(time.perf_counter() - t0)
        placed = len(plan.decisions)
    cycle = statistics.median(cycles)
    return {
        "policy": name,
        "gpus": sum(len(n.gpus) for n in state.nodes),
        "pending": len(state.pending),
        "placed": placed,
        "cycle_ms": 1000.0 * cycle,
        "per_job_ms": 1000.0 * cycle / max(1, len(state.pending)),
    }


def run(quick: bool = False) -> dict:
    """Time both families at each size; print a table; return the figures."""
    sizes = QUICK if quick else FULL
    rows: list[dict[str, Any]] = []
    for gpus in sizes["gpus"]:
        for builder, names in ((sharing_state, SHARING_POLICIES), (kernel_state, KERNEL_POLICIES)):
            state = builder(gpus, int(sizes["pending"]))
            for name in names:
                rows.append(time_policy(name, state, int(sizes["repeats"])))
    print(f"{'policy':<18}{'GPUs':>7}{'pending':>9}{'placed':>8}{'cycle ms':>11}{'ms/job':>9}")
    for r in rows:
        print(
            f"{r['policy']:<18}{r['gpus']:>7,}{r['pending']:>9,}{r['placed']:>8,}"
            f"{r['cycle_ms']:>11.1f}{r['per_job_ms']:>9.3f}"
        )
    top = max(sizes["gpus"])
    goal = {r["policy"]: r["per_job_ms"] for r in rows if r["gpus"] == top}
    met = top == 8_000 and all(v < GOAL_MS for v in goal.values())
    summary: dict[str, Any] = {f"{p} ms/job @ {top:,} GPUs": round(v, 3) for p, v in goal.items()}
    summary[f"goal < {GOAL_MS:g} ms/job @ 8,000 GPUs"] = (
        ("met" if met else "NOT met") if top == 8_000 else "not measured (quick)"
    )
    return {"rows": rows, "goal_met": met, "summary": summary}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sharing_latency")
    parser.add_argument("--quick", action="store_true")
    run(quick=parser.parse_args(argv).quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
