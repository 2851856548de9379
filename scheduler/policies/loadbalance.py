"""``loadbalance``: pair the highest-utilisation job with the lowest (ALGORITHMS.md §2 baseline).

Jobs are considered highest average GPU utilisation first (``profile.gpu_util_pct``; ties keep
queue order), and each goes to the GPU with the lowest load: the sum of the utilisations of the
jobs already on it (profiles, plus the jobs placed earlier in this cycle). Idle GPUs have load 0
and fill first; once they are gone, the next high-utilisation job joins the GPU whose resident is
the least busy. Over a queue this pairs the highest with the lowest: with utilisations 90, 80,
70, 30, 20, 10 on three GPUs, the pairs are (90, 10), (80, 20), (70, 30). Co-located jobs run
under the GPU's best sharing mode (MPS if supported, else time-slicing).

Load is read from profiles, not from the monitored ``GpuState.util_pct``: the same profiles
drive the simulator and the live system, and equal GPUs stay interchangeable.
Multi-GPU jobs take idle GPUs (load 0) exclusively; CPU jobs the CPU node with the most free
cores.

Parameters (besides the framework's):

- ``unknown_util_pct`` (percent, 50.0): utilisation assumed for a job without a profiled one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, ClassVar

from scheduler.domain import JobSpec
from scheduler.policies.framework import (
    Candidate,
    FrameworkPolicy,
    WorkingView,
    framework_defaults,
)


class LoadBalancePolicy(FrameworkPolicy):
    name: ClassVar[str] = "loadbalance"
    defaults: ClassVar[dict[str, Any]] = {**framework_defaults, "unknown_util_pct": 50.0}
    colocate: ClassVar[bool] = True
    scorers: ClassVar[tuple[str, ...]] = ("low_load",)

    def util(self, job: JobSpec) -> float:
        """Average GPU utilisation of ``job`` in percent (profiled, else ``unknown_util_pct``)."""
        if job.profile is not None and job.profile.gpu_util_pct is not None:
            return job.profile.gpu_util_pct
        return float(self.params["unknown_util_pct"])

    def sort_queue(
        self, pending: Sequence[JobSpec], view: WorkingView, rng: random.Random
    ) -> list[JobSpec]:
        return sorted(pending, key=lambda j: -self.util(j))  # stable: ties keep queue order

    def load(self, cand: Candidate) -> float:
        return sum(self.util(j) for j in cand.residents)

    def score_low_load(self, job: JobSpec, cand: Candidate, view: WorkingView) -> float:
        """Minus the GPU's load in percent (CPU: plus the node's free cores)."""
        if not cand.gpus:
            return float(cand.node.free_cores)
        return -self.load(cand)

    def explain(
        self, job: JobSpec, chosen: Candidate, cands: list[Candidate], view: WorkingView
    ) -> str:
        where = self.placement_text(job, chosen)
        n = sum(c.pool_size for c in cands)
        if not chosen.gpus:
            return f"placed {where}: CPU node with the most free cores ({n} fit)"
        if len(chosen.gpus) > 1:
            return self.whole_gpus_text(job, chosen, cands)
        mine = self.util(job)
        if not chosen.residents:
            why = f"an idle GPU (load 0%) for this {mine:.0f}%-utilisation job"
        else:
            load = self.load(chosen)
            why = (
                f"lowest-load GPU ({load:.0f}%) for this {mine:.0f}%-utilisation job, "
                f"combined {load + mine:.0f}%"
            )
        return (
            f"placed {where} {self.residents_text(chosen)}: {why}, among {n} GPUs that fit; "
            f"{self.fit_text(job, chosen)}{self.interference_text(job, chosen)}"
        )
