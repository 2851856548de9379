"""Database rows -> ``scheduler.domain`` types (the "adapter" of DESIGN.md's live loop).

The scheduling core never sees a Django object: the live loop builds its snapshot with these
functions, so the policies run on exactly the types the simulator feeds them. Job ids become
strings (``"42"``), as in traces. Child rows (GPU times, memory steps, GPUs) are read through
``.all()`` so callers can ``prefetch_related`` them and avoid one query per row.
"""

from __future__ import annotations

import importlib
from typing import Any

from portal.core.models import ApplicationProfile, Gpu, Job, Node
from portal.core.states import JobState
from scheduler.catalog import CATALOG, UnknownGpuModel, canonical_model, has_mps_thread_limit
from scheduler.domain import (
    GpuSpec,
    GpuState,
    JobKind,
    JobSpec,
    MemoryStep,
    MigProfile,
    NodeKind,
    NodeState,
    Profile,
    SharingMode,
    StallReasons,
)
from scheduler.policies.hetero_srtf import PREEMPTIONS_PARAM

_STALL_FIELDS = {
    "exec_dependency": "stall_exec_dependency_pct",
    "instruction_fetch": "stall_instruction_fetch_pct",
    "memory_dependency": "stall_memory_dependency_pct",
    "texture": "stall_texture_pct",
    "synchronization": "stall_synchronization_pct",
    "other": "stall_other_pct",
}
# Profile metrics copied one to one (same name and unit on both sides).
_PLAIN_METRICS = (
    "cpu_time_s",
    "gpu_memory_max_mb",
    "gpu_memory_avg_mb",
    "gpu_util_pct",
    "sm_efficiency_pct",
    "warp_efficiency_pct",
    "ipc",
    "occupancy_pct",
    "mem_util_pct",
    "h2d_gbps",
    "d2h_gbps",
    "gld_gbps",
    "gst_gbps",
    "dram_bw_gbps",
    "gflops",
    "epc",
    "registers_per_block",
    "smem_per_block_bytes",
    "l1_transactions",
    "saturation_tbs_per_sm",
    "cm_ratio",
    "sensitivity",
    "batch_size",
    "image_size",
)


def _gpu_model_key(model: str) -> str:
    try:
        return canonical_model(model)
    except UnknownGpuModel:
        return model  # a model the catalogue does not know keeps its own name


def profile_to_domain(profile: ApplicationProfile) -> Profile:
    """An ``ApplicationProfile`` row (with its GPU times and memory steps) as a domain
    ``Profile``. Stall reasons are ``None`` unless at least one stall percentage is known;
    unknown ones then count as 0 %."""
    stall_values = {k: getattr(profile, f) for k, f in _STALL_FIELDS.items()}
    stall = None
    if any(v is not None for v in stall_values.values()):
        stall = StallReasons(**{k: float(v or 0.0) for k, v in stall_values.items()})
    steps = sorted(profile.memory_steps.all(), key=lambda s: s.index)
    return Profile(
        name=profile.name,
        kind=JobKind(profile.kind),
        gpu_time_s={_gpu_model_key(t.gpu_model): t.time_s for t in profile.gpu_times.all()},
        memory_steps=tuple(MemoryStep(s.start_fraction, s.from_mb, s.to_mb) for s in steps),
        stall=stall,
        **{name: getattr(profile, name) for name in _PLAIN_METRICS},
    )


def job_to_domain(job: Job, *, epoch: Any = None) -> JobSpec:
    """A ``Job`` row as a domain ``JobSpec``. ``arrival_s`` is seconds since ``epoch`` (a
    datetime; None: the job's own submission time, i.e. 0)."""
    arrival = 0.0 if epoch is None else (job.submitted_at - epoch).total_seconds()
    return JobSpec(
        id=str(job.pk),
        name=job.name,
        kind=JobKind(job.kind),
        arrival_s=arrival,
        gpus=job.gpus,
        gpu_memory_mb=None if job.gpu_memory_mb is None else float(job.gpu_memory_mb),
        cpus=job.cpus,
        memory_mb=float(job.memory_mb or 0),
        priority=job.priority,
        profile=None if job.profile is None else profile_to_domain(job.profile),
        owner=None if job.owner_id is None else str(job.owner_id),
        job_type=(job.params or {}).get("job_type"),
        elastic_min=job.elastic_min_workers,
        elastic_max=job.elastic_max_workers,
        # The job's past requeues (preemptions, node losses) for policies that bound how often
        # one job is preempted (hetero_srtf's max_preemptions): the portal's count, never the
        # user's (a user-set value could pin a job on its GPUs). A requeue after an OOM beside
        # another job (portal.core.oom) is no preemption.
        params={
            **(job.params or {}),
            PREEMPTIONS_PARAM: max(0, job.requeue_count - job.oom_requeues),
        },
        elastic_deadline_s=(
            None if job.elastic_deadline_s is None else float(job.elastic_deadline_s)
        ),
        elastic_value_per_hour=job.elastic_value_per_hour,
        max_global_batch=job.max_global_batch,
        time_limit_s=None if job.time_limit_s is None else float(job.time_limit_s),
        project=job.project.name if job.project_id is not None and job.project else None,
        oom_with=frozenset(str(t) for t in job.oom_with or ()),
        container=bool((job.container_image or "").strip()),
        # Request semantics (docs/jobs.md): a live job with no known GPU memory is never packed.
        sharing=job.sharing or "never",
        allow_cpu=job.device == "auto",
        pack_unknown_memory=False,
    )


def gpu_spec_of(gpu: Gpu) -> GpuSpec:
    """The ``GpuSpec`` of a physical GPU row: the row's own figures (memory, SMs, modes, MIG
    profiles) over the catalogue entry of its model (bandwidth, peak GFLOPS)."""
    base = CATALOG.get(_gpu_model_key(gpu.model))
    modes = tuple(SharingMode(m) for m in gpu.sharing_modes) if gpu.sharing_modes else None
    migs = tuple(
        MigProfile(p["name"], int(p.get("slices", p.get("compute_slices", 0))), p["memory_mb"])
        for p in gpu.mig_profiles or []
    )
    return GpuSpec(
        model=base.model if base else gpu.model,
        architecture=gpu.architecture or (base.architecture if base else ""),
        memory_mb=gpu.memory_mb,
        sm_count=gpu.sm_count or (base.sm_count if base else 0),
        dram_bw_gbps=base.dram_bw_gbps if base else 0.0,
        peak_gflops=base.peak_gflops if base else 0.0,
        sharing_modes=modes or (base.sharing_modes if base else (SharingMode.EXCLUSIVE,)),
        mig_profiles=migs or (base.mig_profiles if base else ()),
        mig_total_slices=base.mig_total_slices if base else 0,
        mps_thread_limit=(
            base.mps_thread_limit
            if base and not gpu.architecture
            else has_mps_thread_limit(gpu.architecture or "")
        ),
    )


def _placed_jobs(gpu: Gpu) -> list[Any]:
    """Active placements on ``gpu`` whose job holds resources (SCHEDULED / RUNNING / PAUSED)."""
    return [
        p
        for p in gpu.placements.all()
        if p.active and p.job.state in (JobState.SCHEDULED, JobState.RUNNING, JobState.PAUSED)
    ]


def gpu_to_domain(
    gpu: Gpu, *, used_memory_mb: float | None = None, util_pct: float | None = None
) -> GpuState:
    """A ``Gpu`` row as a ``GpuState``: the jobs placed on it (active placements), the memory
    they commit, the MIG slices they hold. ``mode`` is the row's current mode while jobs run
    on it and None when it is idle. Monitored figures may be passed in."""
    spec = gpu_spec_of(gpu)
    placements = _placed_jobs(gpu)
    slices_by_profile = {p.name: p.compute_slices for p in spec.mig_profiles}
    return GpuState(
        node=gpu.node.name,
        index=gpu.index,
        spec=spec,
        mode=SharingMode(gpu.current_mode) if placements else None,
        job_ids=tuple(str(p.job_id) for p in sorted(placements, key=lambda p: p.job_id)),
        committed_memory_mb=float(sum(p.gpu_memory_mb for p in placements)),
        used_memory_mb=used_memory_mb,
        util_pct=util_pct,
        mig_slices_used=sum(slices_by_profile.get(p.mig_profile, 0) for p in placements),
        uuid=gpu.uuid,
        mig_layout=tuple(gpu.mig_layout or ()),
    )


def node_to_domain(node: Node) -> NodeState:
    """A ``Node`` row (with its GPUs) as a ``NodeState``. Free cores subtract the CPUs of the
    active placements on the node; a node is ``up`` only in status up."""
    active = [
        p
        for p in node.placements.all()
        if p.active and p.job.state in (JobState.SCHEDULED, JobState.RUNNING, JobState.PAUSED)
    ]
    used_cores = sum(p.cpus for p in active)
    return NodeState(
        name=node.name,
        kind=NodeKind(node.kind),
        cores=node.cores,
        free_cores=max(0, node.cores - used_cores),
        memory_mb=float(node.memory_mb),
        up=node.status == Node.Status.UP,
        gpus=tuple(gpu_to_domain(g) for g in sorted(node.gpus.all(), key=lambda g: g.index)),
        container_runtimes=tuple(node.container_runtimes or ()),
    )


def derived_classes(profile: ApplicationProfile) -> dict[str, str | None]:
    """The derived classes of a profile, computed by ``scheduler.classes`` (never stored):
    ``kernel_class`` (§3), ``cm_class`` (§4), ``scale_class`` and ``sensitivity_class`` (§4).
    Values are None when the data (or the module) is missing."""
    result: dict[str, str | None] = {
        "kernel_class": None,
        "cm_class": None,
        "scale_class": None,
        "sensitivity_class": None,
    }
    try:
        classes = importlib.import_module("scheduler.classes")
    except ImportError:
        return result
    domain = profile_to_domain(profile)
    for key, func_name in (
        ("kernel_class", "kernel_class"),
        ("cm_class", "cm_class"),
        ("scale_class", "profile_scale_class"),
        ("sensitivity_class", "sensitivity_class"),
    ):
        func = getattr(classes, func_name, None)
        if func is not None:
            try:
                result[key] = func(domain)
            except (TypeError, ValueError, AttributeError):
                result[key] = None
    return result
