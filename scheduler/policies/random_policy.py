"""``random``: a random feasible placement, co-locating (ALGORITHMS.md §4 baseline "Random").

Every feasible GPU is equally likely: idle ones (then shared under their best mode, MPS if
supported, else time-slicing) and shared ones below ``max_jobs_per_gpu`` with the memory free.
Multi-GPU jobs pick among node groups with enough idle GPUs (per GPU model and idle count, the
first node of each), CPU jobs among the CPU nodes with the cores. Draws come only from the
``rng`` passed to ``schedule``: the same seed gives the same plan.

Parameters: the framework's.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from scheduler.domain import JobSpec
from scheduler.policies.framework import (
    Candidate,
    FrameworkPolicy,
    WorkingView,
    framework_defaults,
)


class RandomPolicy(FrameworkPolicy):
    name: ClassVar[str] = "random"
    defaults: ClassVar[dict[str, Any]] = dict(framework_defaults)
    colocate: ClassVar[bool] = True

    def pick(
        self, job: JobSpec, cands: list[Candidate], view: WorkingView, rng: random.Random
    ) -> Candidate | None:
        """Uniform over GPUs: a pool is drawn in proportion to its size, then a GPU in it."""
        total = sum(c.pool_size for c in cands)
        draw = rng.randrange(total)
        for cand in cands:
            if draw < cand.pool_size:
                if cand.pool is not None and cand.pool_size > 1:
                    gpu = cand.pool[draw]
                    if gpu.node.has_cores(job.cpus):
                        cand.gpus = (gpu,)
                        cand.node = gpu.node
                return cand
            draw -= cand.pool_size
        return cands[-1]

    def explain(
        self, job: JobSpec, chosen: Candidate, cands: list[Candidate], view: WorkingView
    ) -> str:
        if len(chosen.gpus) > 1:
            return self.whole_gpus_text(job, chosen, cands) + " (random pick)"
        n = sum(c.pool_size for c in cands)
        kind = "CPU nodes" if not chosen.gpus else "placements"
        text = f"placed {self.placement_text(job, chosen)}"
        if chosen.gpus and len(chosen.gpus) == 1:
            text += f" {self.residents_text(chosen)}"
        text += f": random pick among {n} feasible {kind}"
        if chosen.gpus:
            text += f"; {self.fit_text(job, chosen)}{self.interference_text(job, chosen)}"
        return text
