"""The texts of decisions and waiting reasons: how the framework words a placement.

Every decision carries a human-readable explanation with numbers (DESIGN.md): "placed on
n3/gpu1 under MPS with job 88 (resnet50): ...; needs 9.1 of 16.0 GB free". The policies of
``scheduler.policies`` build theirs from these pieces (``FrameworkPolicy.placement_text`` and
its neighbours call them); the waiting reasons quote sizes with ``gb`` and predicted waits with
``duration_text``. Units: memory in MB in, GB out; durations in seconds.
"""

from __future__ import annotations

from scheduler.domain import JobSpec, MigProfile, SharingMode
from scheduler.interference import InterferenceModel, co_run_slowdown
from scheduler.policies.candidate import Candidate, job_type_key

_MB_PER_GB = 1024.0


def gb(mb: float) -> str:
    """``mb`` megabytes as a short GB figure for explanations ("9.1")."""
    return f"{mb / _MB_PER_GB:.1f}"


def memory_basis(job: JobSpec) -> str:
    """What the policy knows of ``job``'s GPU memory: "9.1 GB declared", "8.3 GB, its
    profile's max" or "unknown (no profiled max, no gpu_memory_mb)"."""
    if job.gpu_memory_mb is not None:
        return f"{gb(job.gpu_memory_mb)} GB declared"
    if job.profile is not None and job.profile.gpu_memory_max_mb is not None:
        return f"{gb(job.profile.gpu_memory_max_mb)} GB, its profile's max"
    return "unknown (no profiled max, no gpu_memory_mb)"


def request_text(job: JobSpec, cand: Candidate | None) -> str:
    """What a GPU job's placement (``cand``) or waiting reason (None) adds about its request:
    "; a GPU of its own: <why>" for a job that may not share; "; packed on its GPU memory:
    <basis>" for a job placed beside others; "" otherwise."""
    if job.gpus <= 0:
        return ""
    why = job.whole_gpu_reason()
    if why is not None:
        return f"; whole GPUs of its own: {why}"
    if cand is not None and cand.residents:
        return f"; shares (sharing: {job.sharing}) on its GPU memory: {memory_basis(job)}"
    return ""


def mode_text(mode: SharingMode, mig_profile: MigProfile | None) -> str:
    """ "exclusive", "under MPS", "under time-slicing", "under MIG 1g.5gb"."""
    if mode == SharingMode.MIG:
        return f"under MIG {mig_profile.name}" if mig_profile is not None else "under MIG"
    if mode == SharingMode.MPS:
        return "under MPS"
    if mode == SharingMode.TIME_SLICING:
        return "under time-slicing"
    return "exclusive"


def duration_text(seconds: float) -> str:
    """ "about 25 min", "about 3.5 h", "about 2 days" (for predicted waits)."""
    if seconds < 90:
        return f"about {max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"about {round(seconds / 60)} min"
    if seconds < 48 * 3600:
        hours = seconds / 3600
        return f"about {hours:.1f} h" if hours < 10 else f"about {round(hours)} h"
    return f"about {seconds / 86400:.1f} days"


def placement_text(job: JobSpec, cand: Candidate) -> str:
    """ "on n3/gpu1 exclusive" (GPU) or "on cpu-0 (4 cores)" (CPU)."""
    if not cand.gpus:
        return f"on {cand.node.name} ({job.cpus} of {cand.node.free_cores} free cores)"
    return f"on {cand.label} {mode_text(cand.mode, cand.mig_profile)}"


def fit_text(job: JobSpec, cand: Candidate) -> str:
    """ "needs 9.1 of 16.0 GB free" for the chosen GPU (per GPU for multi-GPU jobs)."""
    if not cand.gpus:
        return f"needs {job.cpus} of {cand.node.free_cores} free cores"
    gpu = cand.gpus[0]
    need = job.memory_need_mb()
    if cand.mig_profile is not None:
        return f"needs {gb(need)} of the instance's {gb(cand.mig_profile.memory_mb)} GB"
    each = " per GPU" if len(cand.gpus) > 1 else ""
    if not job.memory_known():  # nothing to compare: say what is assumed, not "needs 0.0"
        if job.pack_unknown_memory:
            return (
                f"GPU memory unknown (no profile max, no gpu_memory_mb): counted as 0 GB "
                f"(pack_unknown_memory); {gb(gpu.free_mb)} GB free{each}"
            )
        return "GPU memory unknown"  # the framework adds why it gets whole GPUs of its own
    return f"needs {gb(need)} of {gb(gpu.free_mb)} GB free{each}"


def whole_gpus_text(job: JobSpec, cand: Candidate, cands: list[Candidate]) -> str:
    """Explanation for a CPU or multi-GPU placement by a co-locating policy (these take
    whole idle GPUs, or a CPU node, whatever the policy's scoring)."""
    where = placement_text(job, cand)
    if not cand.gpus:
        return f"placed {where}: CPU node chosen among {len(cands)} that fit"
    gpu = cand.gpus[0]
    if len(cand.gpus) == 1:  # a one-GPU job in the mode it asked (``honour_request``)
        return (
            f"placed {where} {residents_text(cand)}: chosen among {len(cands)} GPUs "
            f"that fit what it asked (sharing: {job.sharing}); {fit_text(job, cand)}"
        )
    return (
        f"placed {where}: {len(cand.gpus)} whole idle {gpu.spec.model} on one node "
        f"(multi-GPU jobs do not share), chosen among {len(cands)} node groups that fit; "
        f"{fit_text(job, cand)}"
    )


def residents_text(cand: Candidate) -> str:
    """ "with job 88 (resnet50), job 90 (lm)" or "alone for now"."""
    if not cand.residents:
        return "alone for now"
    return "with " + ", ".join(f"job {j.id} ({job_type_key(j)})" for j in cand.residents)


def interference_text(model: InterferenceModel | None, job: JobSpec, cand: Candidate) -> str:
    """ "; predicted slowdown 1.31 (measured)" when an interference ``model`` is configured."""
    if model is None or not cand.residents or cand.gpu is None:
        return ""
    s = co_run_slowdown(model, job, cand.residents, cand.gpu.spec, cand.mode)
    return f"; predicted slowdown {s:.2f} ({model.name})"
