"""``all_gpu``: FIFO on GPU nodes only, the "everything on GPU" baseline of seed 004 (§1).

Jobs are taken in queue order and each goes to the first GPU in cluster order that can take it,
sharing GPUs up to ``max_jobs_per_gpu`` jobs (the paper's GPU containers share one Titan Xp;
memory by the jobs' declared needs, plus the memory the GPU uses now, as in
``placement_rate``). A job that asks for a GPU never goes to a CPU node, even when its profile
has a CPU time; a job that asks for no GPU has no GPU option and goes to the first CPU node with
the cores. Strict queue order: the first job that does not fit blocks the ones behind it.

Parameters: the framework's, with ``backfill`` **False** here (strict FIFO).
"""

from __future__ import annotations

from typing import Any, ClassVar

from scheduler.domain import JobSpec
from scheduler.policies.framework import Candidate, WorkingView, framework_defaults
from scheduler.policies.placement_rate import UsedMemoryGuard


class AllGpuPolicy(UsedMemoryGuard):
    name: ClassVar[str] = "all_gpu"
    defaults: ClassVar[dict[str, Any]] = {**framework_defaults, "backfill": False}
    colocate: ClassVar[bool] = True

    def explain(
        self, job: JobSpec, chosen: Candidate, cands: list[Candidate], view: WorkingView
    ) -> str:
        if not chosen.gpus:
            return (
                f"placed {self.placement_text(job, chosen)}: asks for no GPU; first CPU "
                f"node in order with the cores"
            )
        return (
            f"placed {self.placement_text(job, chosen)} {self.residents_text(chosen)}: first "
            f"GPU in cluster order that fits (queue order, GPU nodes only); "
            f"{self.fit_text(job, chosen)}"
        )
