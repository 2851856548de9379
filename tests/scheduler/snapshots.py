"""Tiny hand-built cluster snapshots and an independent checker of plans, for policy tests."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from scheduler.catalog import gpu_spec
from scheduler.domain import (
    ClusterState,
    GpuState,
    JobSpec,
    NodeKind,
    NodeState,
    Placement,
    Plan,
    Profile,
    RunningJob,
    SharingMode,
)

GB = 1024.0


def gpu_node(
    name: str,
    model: str,
    count: int = 2,
    *,
    cores: int = 8,
    up: bool = True,
    gpus: Mapping[int, GpuState] | None = None,
) -> NodeState:
    """A GPU node with ``count`` idle GPUs of ``model`` (``gpus`` overrides some indices)."""
    spec = gpu_spec(model)
    states = tuple(
        (gpus or {}).get(i, GpuState(node=name, index=i, spec=spec)) for i in range(count)
    )
    return NodeState(name, NodeKind.GPU, cores, cores, up=up, gpus=states)


def cpu_node(name: str, cores: int = 4, free: int | None = None, up: bool = True) -> NodeState:
    return NodeState(name, NodeKind.CPU, cores, cores if free is None else free, up=up)


def job(
    id: str,
    mem_gb: float = 4.0,
    gpus: int = 1,
    *,
    cpus: int = 1,
    util: float | None = None,
    job_type: str | None = None,
    **profile_metrics: float,
) -> JobSpec:
    profile = None
    if util is not None or profile_metrics:
        profile = Profile(job_type or id, gpu_util_pct=util, **profile_metrics)
    return JobSpec(
        id=id,
        gpus=gpus,
        gpu_memory_mb=mem_gb * GB,
        cpus=cpus,
        profile=profile,
        job_type=job_type,
    )


def busy_gpu(
    node: str,
    index: int,
    model: str,
    jobs: Iterable[JobSpec],
    mode: SharingMode,
    *,
    mig_slices_used: int = 0,
) -> tuple[GpuState, list[RunningJob]]:
    """A GPU running ``jobs`` under ``mode``, and the RunningJob records to put in the state."""
    jobs = list(jobs)
    state = GpuState(
        node=node,
        index=index,
        spec=gpu_spec(model),
        mode=mode,
        job_ids=tuple(j.id for j in jobs),
        committed_memory_mb=sum(j.memory_need_mb() for j in jobs),
        mig_slices_used=mig_slices_used,
    )
    running = [
        RunningJob(j, Placement(j.id, node, (index,), mode, cpus=j.cpus), started_s=0.0)
        for j in jobs
    ]
    return state, running


def check_plan(state: ClusterState, plan: Plan, max_jobs_per_gpu: int | None = None) -> None:
    """Assert the plan respects the snapshot's capacity; raise AssertionError with the reason."""
    pending = {j.id: j for j in state.pending}
    decided = [d.placement.job_id for d in plan.decisions]
    assert len(decided) == len(set(decided)), f"a job decided twice: {decided}"
    assert set(decided) <= set(pending), "a decision for a job that is not pending"
    assert not set(decided) & set(plan.waiting), "a job both placed and waiting"
    assert set(decided) | set(plan.waiting) == set(pending), "a pending job got no answer"
    for job_id, reason in plan.waiting.items():
        assert reason.strip(), f"empty waiting reason for {job_id}"

    nodes = {n.name: n for n in state.nodes}
    gpu_jobs: dict[tuple[str, int], list[tuple[JobSpec, SharingMode, str | None]]] = defaultdict(
        list
    )
    used_cores: dict[str, int] = defaultdict(int)
    for d in plan.decisions:
        assert d.explanation.strip(), "empty explanation"
        assert d.policy, "decision without a policy name"
        p = d.placement
        j = pending[p.job_id]
        node = nodes[p.node]
        assert node.up, f"{j.id} placed on down node {node.name}"
        if j.gpus == 0:
            assert node.kind == NodeKind.CPU and not p.gpu_indices, f"CPU job {j.id} on {node}"
        else:
            assert node.kind == NodeKind.GPU, f"GPU job {j.id} on CPU node"
            assert len(p.gpu_indices) == j.gpus == len(set(p.gpu_indices)), p
            if j.gpus > 1:
                assert p.mode == SharingMode.EXCLUSIVE, f"multi-GPU job {j.id} shares"
        if node.cores > 0:
            used_cores[node.name] += j.cpus
        times = j.profile.gpu_time_s if j.profile is not None else {}
        for i in p.gpu_indices:
            gpu = node.gpus[i]
            if times:
                assert gpu.spec.model in times, f"{j.id} on unprofiled {gpu.spec.model}"
            gpu_jobs[(node.name, i)].append((j, p.mode, p.mig_profile))
    for name, cores in used_cores.items():
        assert cores <= nodes[name].free_cores, f"cores over-committed on {name}"

    for (node_name, i), new in gpu_jobs.items():
        gpu = nodes[node_name].gpus[i]
        spec = gpu.spec
        modes = {m for _, m, _ in new}
        if gpu.job_ids:
            modes.add(gpu.mode or SharingMode.EXCLUSIVE)
        assert len(modes) == 1, f"{node_name}/{i} mixes modes {modes}"
        (mode,) = modes
        assert spec.supports(mode), f"{spec.model} does not support {mode}"
        total_jobs = len(gpu.job_ids) + len(new)
        if mode == SharingMode.EXCLUSIVE:
            assert total_jobs == 1, f"{node_name}/{i} double-booked exclusive"
        elif mode == SharingMode.MIG:
            profiles = {p.name: p for p in spec.mig_profiles}
            slices = gpu.mig_slices_used
            for j, _, prof_name in new:
                prof = profiles[prof_name]
                assert prof.memory_mb >= j.memory_need_mb(), f"{j.id} too big for {prof_name}"
                slices += prof.compute_slices
            assert slices <= spec.mig_total_slices, f"{node_name}/{i} MIG slices over-committed"
        else:
            need = gpu.committed_memory_mb + sum(j.memory_need_mb() for j, _, _ in new)
            assert need <= spec.memory_mb, f"{node_name}/{i} memory over-committed"
            if max_jobs_per_gpu is not None:
                assert total_jobs <= max_jobs_per_gpu, f"{node_name}/{i} over the job limit"
