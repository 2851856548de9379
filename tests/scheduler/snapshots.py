"""Tiny hand-built cluster snapshots and an independent checker of plans, for policy tests."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import replace

from scheduler.catalog import gpu_spec
from scheduler.domain import (
    ActionKind,
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


def _usable_gpus(node: NodeState, j: JobSpec) -> int:
    """The most GPUs of one model ``j`` may use (profiled, memory) on ``node``."""
    if node.cores > 0 and node.cores < j.cpus:
        return 0
    times = j.profile.gpu_time_s if j.profile is not None else {}
    counts: dict[str, int] = defaultdict(int)
    for g in node.gpus:
        if g.spec.memory_mb >= j.memory_need_mb() and (not times or times.get(g.spec.model)):
            counts[g.spec.model] += 1
    return max(counts.values(), default=0)


def check_plan(state: ClusterState, plan: Plan, max_jobs_per_gpu: int | None = None) -> None:
    """Assert the plan respects the snapshot's capacity; raise AssertionError with the reason."""
    pending = {j.id: j for j in state.pending}
    # A running job the plan requeues (preemption) frees its GPUs and cores before the
    # decisions apply (the simulator applies actions first) and may be placed again (moved).
    running = {r.job.id: r for r in state.running}
    requeued = {a.job_id for a in plan.actions if a.kind == ActionKind.REQUEUE}
    assert requeued <= set(running), "requeues a job that is not running"
    queued = set(pending)
    pending.update({i: running[i].job for i in requeued})
    decided = [d.placement.job_id for d in plan.decisions]
    assert len(decided) == len(set(decided)), f"a job decided twice: {decided}"
    assert set(decided) <= set(pending), "a decision for a job that is not pending"
    assert not set(decided) & set(plan.waiting), "a job both placed and waiting"
    assert queued <= set(decided) | set(plan.waiting), "a pending job got no answer"
    assert set(plan.waiting) <= queued | requeued, "a waiting reason for a job not queued"
    for job_id, reason in plan.waiting.items():
        assert reason.strip(), f"empty waiting reason for {job_id}"

    nodes = {n.name: n for n in state.nodes}
    gpu_jobs: dict[tuple[str, int], list[tuple[JobSpec, SharingMode, str | None]]] = defaultdict(
        list
    )
    used_cores: dict[str, int] = defaultdict(int)
    for i in requeued:
        for part in running[i].placement.parts:
            used_cores[part.node] -= part.cpus
    for d in plan.decisions:
        assert d.explanation.strip(), "empty explanation"
        assert d.policy, "decision without a policy name"
        p = d.placement
        j = pending[p.job_id]
        names = p.nodes
        assert len(set(names)) == len(names), f"{j.id} lists a node twice: {names}"
        if j.gpus == 0:
            node = nodes[p.node]
            assert not p.is_gang, f"CPU job {j.id} spread over nodes"
            assert not p.gpu_indices, f"CPU job {j.id} given GPUs on {node}"
        else:
            keys = p.gpu_keys
            assert len(keys) == j.gpus == len(set(keys)), f"{j.id}: {j.gpus} GPUs asked, {p}"
            assert all(part.gpu_indices for part in p.parts), f"{j.id}: a gang part without GPU"
            models = {nodes[n].gpus[i].spec.model for n, i in keys}
            assert len(models) == 1, f"{j.id} mixes GPU models {models}"
            if j.gpus > 1:
                # Multi-GPU jobs share only under MPS, with jobs of the same GPU count.
                assert p.mode in (SharingMode.EXCLUSIVE, SharingMode.MPS), (
                    f"multi-GPU job {j.id} shares"
                )
            if p.is_gang:
                # A gang only when no up node could hold the job on its own (GPUs of one model
                # it may use, with the memory, and the cores), busy or not.
                biggest = max((_usable_gpus(n, j) for n in state.nodes if n.up), default=0)
                assert biggest < j.gpus, f"{j.id} spread though one node holds it"
        times = j.profile.gpu_time_s if j.profile is not None else {}
        for part in p.parts:
            node = nodes[part.node]
            assert node.up, f"{j.id} placed on down node {node.name}"
            if j.gpus > 0:
                assert node.kind == NodeKind.GPU, f"GPU job {j.id} on CPU node"
            assert part.cpus == j.cpus, f"{j.id}: {part.cpus} cores on {node.name}, asks {j.cpus}"
            if node.cores > 0:
                used_cores[node.name] += j.cpus
            for i in part.gpu_indices:
                gpu = node.gpus[i]
                if times:
                    assert gpu.spec.model in times, f"{j.id} on unprofiled {gpu.spec.model}"
                gpu_jobs[(node.name, i)].append((j, p.mode, p.mig_profile))
    for name, cores in used_cores.items():
        assert cores <= nodes[name].free_cores, f"cores over-committed on {name}"

    for (node_name, i), new in gpu_jobs.items():
        gpu = nodes[node_name].gpus[i]
        staying = tuple(x for x in gpu.job_ids if x not in requeued)
        if staying != gpu.job_ids:
            gone = sum(running[x].job.memory_need_mb() for x in gpu.job_ids if x in requeued)
            gpu = replace(gpu, job_ids=staying, committed_memory_mb=gpu.committed_memory_mb - gone)
        spec = gpu.spec
        modes = {m for _, m, _ in new}
        if gpu.job_ids:
            modes.add(gpu.mode or SharingMode.EXCLUSIVE)
        sizes = {j.gpus for j, _, _ in new} | {
            running[x].job.gpus for x in gpu.job_ids if x in running
        }
        if max(sizes) > 1 and len(new) + len(gpu.job_ids) > 1:
            assert len(sizes) == 1, f"{node_name}/{i} shared by jobs of different GPU counts"
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


def completion(job_id: str, job_type: str, seconds: float, owner: str | None = None):
    """A knowledge ``COMPLETED`` observation: ``job_id`` of ``job_type`` ran ``seconds``."""
    from scheduler.knowledge.observations import Observation, ObservationKind

    return Observation(
        kind=ObservationKind.COMPLETED,
        job_id=job_id,
        job_type=job_type,
        at_s=0.0,
        window_s=seconds,
        gpu_model="V100",
        gpus=1,
        progress_from=0.0,
        progress_to=1.0,
        owner=owner,
    )
