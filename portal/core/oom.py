"""GPU out-of-memory on a shared GPU: the job is requeued, not failed, and kept away from what it
died beside.

When jobs share a GPU (MPS or time-slicing; a MIG instance has memory of its own) one can run
out of GPU memory because of the others: not the owner's fault. The node reports the attempt's
end with its exit status and the tail of its log; a non-zero exit whose log tail carries a
CUDA out-of-memory message (``GPU_OOM``: PyTorch, TensorFlow, JAX, the CUDA runtime and driver)
on an attempt that shared its GPU with another job is such a death. The job goes back to
PENDING with the types of the jobs it shared with added to ``Job.oom_with``
(``JobSpec.oom_with``); the scheduling framework then places it beside none of them again, and
no job of those types beside it (docs/simulator.md, "OOM", where the simulator does the same).
After ``COSCHED_OOM_REQUEUES`` (3) such requeues the job fails as any exit would. An OOM on a GPU
the job had to itself is the job's own, and fails it.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings

from portal.core.models import Job, Placement

#: Messages of a process that ran out of GPU memory (case-insensitive).
GPU_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation"
    r"|OOM when allocating tensor|RESOURCE_EXHAUSTED: Out of memory|out of memory on device",
    re.IGNORECASE,
)


def gpu_oom_line(log_tail: str | None) -> str | None:
    """The last line of ``log_tail`` that says the process ran out of GPU memory (None: no
    such line)."""
    if not log_tail:
        return None
    for line in reversed(log_tail.splitlines()):
        if GPU_OOM.search(line):
            return line.strip()[:300]
    return None


def oom_requeue(
    job: Job, placement: Placement, exit_code: int | None, log_tail: str | None
) -> dict[str, Any] | None:
    """Whether the attempt ``placement`` of ``job`` that exited with ``exit_code`` died of GPU
    out-of-memory beside other jobs and is to be requeued: None, or the fields and message of
    the requeue (``oom_with``, ``oom_requeues``, ``message``). Call it before the job is failed;
    the co-runners are the jobs whose active attempts hold one of its GPUs now."""
    if exit_code in (0, None) or placement.sharing_mode in ("exclusive", "mig"):
        return None
    line = gpu_oom_line(log_tail)
    if line is None:
        return None
    gpu_ids = list(placement.gpus.values_list("pk", flat=True))
    beside = list(
        Job.objects.filter(placements__active=True, placements__gpus__in=gpu_ids)
        .exclude(pk=job.pk)
        .select_related("profile")
        .distinct()
        .order_by("pk")
    )
    if not beside:
        return None  # it had the GPU to itself: its own OOM
    known, done = list(job.oom_with or []), job.oom_requeues
    if done >= int(settings.COSCHED["OOM_REQUEUES"]):
        return None
    from portal.core.adapters import job_to_domain

    types = {job_to_domain(other).type_key(): other for other in beside}
    # a job without a type or profile is its own type, "#<id>": said as "job <id>"
    names = ", ".join(
        f"job {other.pk}" + ("" if t.startswith("#") else f" ({t})")
        for t, other in sorted(types.items())
    )
    kinds = ", ".join(f"job {t[1:]}" if t.startswith("#") else t for t in sorted(types))
    return {
        "oom_with": sorted(set(known) | set(types)),
        "oom_requeues": done + 1,
        "message": (
            f"out of GPU memory beside {names} ({line!r}): requeued "
            f"({done + 1} of {settings.COSCHED['OOM_REQUEUES']}); it will not be placed beside "
            f"{kinds} again"
        ),
    }
