"""``fifo``: exclusive GPUs, first fit, strict queue order (ALGORITHMS.md §2 baseline).

Each job gets whole GPUs to itself. Candidates are the first fitting idle GPU of each GPU model
(or, for a ``k``-GPU job, the first node with ``k`` idle GPUs of one model); the first in cluster
order wins (nodes in snapshot order, then GPU index). CPU-only jobs go to the first CPU node with
enough free cores.

Parameters (besides the framework's, see ``scheduler.policies.framework``):

- ``backfill`` (bool, **False** here): off, the first job that does not fit blocks every job
  behind it (strict FIFO); on, later jobs that fit go ahead (no reservation for the head).
"""

from __future__ import annotations

from typing import Any, ClassVar

from scheduler.domain import JobSpec
from scheduler.policies.framework import Candidate, FrameworkPolicy, WorkingView, framework_defaults


class FifoPolicy(FrameworkPolicy):
    name: ClassVar[str] = "fifo"
    defaults: ClassVar[dict[str, Any]] = {**framework_defaults, "backfill": False}
    colocate: ClassVar[bool] = False

    def explain(
        self, job: JobSpec, chosen: Candidate, cands: list[Candidate], view: WorkingView
    ) -> str:
        where = self.placement_text(job, chosen)
        if not chosen.gpus:
            return f"placed {where}: first CPU node in order with {job.cpus} free cores"
        gpu = chosen.gpus[0]
        if len(chosen.gpus) > 1:
            why = (
                f"first node in order with {len(chosen.gpus)} idle {gpu.spec.model} "
                f"({chosen.node.idle_count(gpu)} idle there)"
            )
        else:
            idle = chosen.pool_size
            why = f"first fit among {idle} idle {gpu.spec.model}"
            if len(cands) > 1:
                why += f" ({len(cands)} GPU models fit)"
        return f"placed {where}: {why}; {self.fit_text(job, chosen)}"
