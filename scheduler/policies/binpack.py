"""``binpack``: by GPU memory, the fullest GPU that still fits (ALGORITHMS.md §2 baseline).

A single-GPU job goes to the GPU with the least free memory left after placing it: a GPU
already shared (under MPS or time-slicing, below ``max_jobs_per_gpu`` jobs), a MIG instance,
or, when nothing shared fits, the smallest idle GPU that holds it, which is then shared under
its best mode (MPS if supported, else time-slicing) so the next jobs can join. Ties go to the
first GPU in cluster order. A ``k``-GPU job takes ``k`` idle GPUs on the node with the fewest
idle GPUs that still has ``k`` (the fullest node); a gang (larger than any node) the model
whose most consolidated gang leaves the fewest idle GPUs on its nodes; a CPU job the CPU node
with the fewest free cores that fit.

The paper packs by node; with several GPUs per node we pack by GPU, which is the same thing on
its one-GPU nodes and keeps the co-located pair on one device.

Parameters: the framework's (``max_jobs_per_gpu`` 2, ``share_mode`` "auto", ``backfill`` True,
``interference`` None: name a model, e.g. "measured", to quote its predicted slowdown).
"""

from __future__ import annotations

from typing import Any, ClassVar

from scheduler.domain import JobSpec
from scheduler.policies.framework import (
    Candidate,
    FrameworkPolicy,
    WorkingView,
    framework_defaults,
    gb,
)


class BinpackPolicy(FrameworkPolicy):
    name: ClassVar[str] = "binpack"
    defaults: ClassVar[dict[str, Any]] = dict(framework_defaults)
    colocate: ClassVar[bool] = True
    scorers: ClassVar[tuple[str, ...]] = ("fullness",)

    def score_fullness(self, job: JobSpec, cand: Candidate, view: WorkingView) -> float:
        """Minus what is left after placing: MB on the GPU, idle GPUs on the node, or cores."""
        if not cand.gpus:
            return -(cand.node.free_cores - job.cpus)
        gpu = cand.gpus[0]
        if len(cand.gpus) > 1:
            return -cand.idle_left()  # idle GPUs left on its node(s), a gang's too
        if cand.mig_profile is not None:
            return -(cand.mig_profile.memory_mb - job.memory_need_mb())
        return -(gpu.free_mb - job.memory_need_mb())

    def explain(
        self, job: JobSpec, chosen: Candidate, cands: list[Candidate], view: WorkingView
    ) -> str:
        where = self.placement_text(job, chosen)
        n = sum(c.pool_size for c in cands)
        if not chosen.gpus:
            left = chosen.node.free_cores - job.cpus
            return f"placed {where}: fullest CPU node that fits, {left} cores left ({n} fit)"
        if len(chosen.gpus) > 1:
            left = -int(chosen.score)
            return (
                f"placed {where}: fullest node with {len(chosen.gpus)} idle "
                f"{chosen.gpus[0].spec.model}, {left} idle left ({n} nodes fit); "
                f"{self.fit_text(job, chosen)}"
            )
        return (
            f"placed {where} {self.residents_text(chosen)}: fullest GPU that fits, "
            f"{gb(-chosen.score)} GB left after placing ({n} GPUs fit); "
            f"{self.fit_text(job, chosen)}{self.interference_text(job, chosen)}"
        )
