"""How fast a placed job runs and when memory runs out: the sharing and interference model as the
simulator applies it (docs/simulator.md).

Sharing factor per GPU: EXCLUSIVE 1; TIME_SLICING ``1 / (n * (1 + overhead) * part)`` with ``n``
unpaused jobs (n > 1) and ``part`` the interference model's time-slicing part; MPS
``1 / slowdown`` from the interference model next to the unpaused co-runners; MIG
``(slices / total) ** mig_speed_exponent``; a model that knows placements (MPS percentages,
MIG instances: ``scheduler.simulator.sharing.SharingModel``) answers for every mode. Slowdowns
below 1 are clamped to 1; an infinite slowdown ("cannot co-run") gives 0. Memory: when the jobs
on a GPU (or one MIG instance) outgrow it, the growing job is the one to blame.
"""

from __future__ import annotations

import math

from scheduler.domain import SharingMode
from scheduler.interference import InterferenceModel
from scheduler.simulator.results import SimConfig
from scheduler.simulator.state import MEM_TOL_MB, SimGpu, SimJob


def gpu_factor(
    job: SimJob, gpu: SimGpu, interference: InterferenceModel | None, config: SimConfig
) -> float:
    """The speed of ``job`` on ``gpu`` relative to running alone (0: it cannot co-run)."""
    mode = gpu.mode
    # Sharing hook: a model that needs placements (MPS percentages, MIG instances)
    # answers for every mode (scheduler.simulator.sharing.SharingModel).
    by_placement = getattr(interference, "gpu_factor", None)
    if by_placement is not None:
        co = [(j.spec, j.placement) for j in gpu.jobs if j is not job and not j.paused]
        return by_placement(
            job.spec, job.placement, gpu.spec, mode, co, config.context_switch_overhead
        )
    if mode == SharingMode.MIG:
        slices = mig_slices(gpu, job.mig_profile)
        total = gpu.spec.mig_total_slices or slices
        return (slices / total) ** config.mig_speed_exponent
    if mode == SharingMode.EXCLUSIVE or mode is None:
        return 1.0
    co_specs = [j.spec for j in gpu.jobs if j is not job and not j.paused]
    if not co_specs:
        return 1.0
    part = 1.0
    if interference is not None:
        part = interference.slowdown(job.spec, co_specs, gpu.spec, mode)
        if math.isinf(part) or math.isnan(part):
            return 0.0
        part = max(1.0, part)
    if mode == SharingMode.TIME_SLICING:
        return 1.0 / ((1 + len(co_specs)) * (1.0 + config.context_switch_overhead) * part)
    return 1.0 / part


def gpu_util(gpu: SimGpu) -> float:
    """Utilisation of ``gpu`` (0..1): busy if an unpaused job runs; under MIG, the share of the
    compute slices unpaused jobs hold."""
    if gpu.mode == SharingMode.MIG:
        total = gpu.spec.mig_total_slices or 1
        used = sum(mig_slices(gpu, j.mig_profile) for j in gpu.jobs if not j.paused)
        return min(1.0, used / total)
    return 1.0 if any(not j.paused for j in gpu.jobs) else 0.0


def mig_slices(gpu: SimGpu, profile: str | None) -> int:
    """Compute slices of MIG profile ``profile`` on ``gpu`` (0: unknown profile)."""
    for p in gpu.spec.mig_profiles:
        if p.name == profile:
            return p.compute_slices
    return 0


def mig_memory(gpu: SimGpu, job: SimJob) -> float:
    """Memory (MB) ``job`` may use on ``gpu``: its MIG instance's, else the whole GPU's."""
    name = job.placement.mig_profile if job.placement else None
    for p in gpu.spec.mig_profiles:
        if p.name == name:
            return float(p.memory_mb)
    return float(gpu.spec.memory_mb)


def oom_victims(gpu: SimGpu, now: float) -> list[SimJob]:
    """The jobs on ``gpu`` to OOM-kill at ``now``: under MIG each job over its instance; else
    the one to blame (``grower``) when the jobs together outgrow the GPU; none if they fit."""
    if gpu.mode == SharingMode.MIG:
        out = []
        for j in gpu.jobs:
            cap = mig_memory(gpu, j)
            if j.mem_at(j.progress_at(now)) > cap + MEM_TOL_MB / 2:
                out.append(j)
        return out
    total = sum(j.mem_at(j.progress_at(now)) for j in gpu.jobs)
    if total <= gpu.spec.memory_mb + MEM_TOL_MB / 2:
        return []
    return [grower(gpu, now)]


def grower(gpu: SimGpu, now: float) -> SimJob:
    """The job to blame for an OOM at ``now``: the fastest-growing one, else the last
    placed."""

    def key(j: SimJob) -> tuple[float, float, int]:
        growth = 0.0 if j.paused else j.mem_slope(j.progress_at(now)) * j.rate
        return (growth, j.last_start, j.seq)

    return max(gpu.jobs, key=key)


def oom_check_at(gpu: SimGpu, now: float) -> float | None:
    """When the jobs on ``gpu`` will outgrow it (or one MIG instance) at their current speeds
    (``now`` if they already have), or None if they never will."""
    if not gpu.jobs or not gpu.live:
        return None
    if gpu.mode == SharingMode.MIG:
        best = math.inf
        for j in gpu.jobs:
            p = j.progress_at(now)
            growth = 0.0 if j.paused else j.mem_slope(p) * j.rate
            room = mig_memory(gpu, j) + MEM_TOL_MB - j.mem_at(p)
            if room <= MEM_TOL_MB / 2:
                best = now
            elif growth > 0:
                best = min(best, now + room / growth)
        return best if best < math.inf else None
    total = 0.0
    growth = 0.0
    for j in gpu.jobs:
        p = j.progress_at(now)
        total += j.mem_at(p)
        if not j.paused:
            growth += j.mem_slope(p) * j.rate
    room = gpu.spec.memory_mb + MEM_TOL_MB - total
    if room <= MEM_TOL_MB / 2:
        return now
    if growth > 0:
        return now + room / growth
    return None
