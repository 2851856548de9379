"""``sharing_chain``: the default that chains the seed algorithms, one stage after another.

1. **Placement rate** (seed 004, ``placement_rate``): the queue is ranked by the GPU placement
   rate and split into a GPU side and a CPU side (CPU jobs and jobs that finish sooner on a CPU
   node go there); jobs are considered in rank order.
2. **Sharing mode** (paper 001, ``sharing_mode``): a GPU-side job gets time-slicing, MPS or MIG
   by the criteria of §4.3.2 on each candidate GPU, and the GPU where it is expected to finish
   first.
3. **Pairing** (thesis 003): a candidate that would share a GPU (MPS or time-slicing) with a
   job it pairs badly with is kept only as a last resort: two memory-intensive jobs (C/M class
   M, or ``memory`` kernels: rule 4), two ``l1`` kernels or an L1-heavy kernel next to one (rule
   3), two high-EPC compute kernels (rule 5); kernels are also held to rules 1-2 (per-SM
   resources and bandwidth) as ``kscheduler`` does. MPS groups stay one user's.
4. **Memory plan** (seed 004, ``exec_plan``): every interval the jobs on each shared GPU are
   checked against their profiled memory steps; the lowest-rated growing job is paused before
   the GPU would run out of memory, and resumed when its next step fits.

Each decision's explanation names the stages: ``rate ...; mode: ...; pairing: ...``, and the
memory plan adds its own pause / resume reasons. Which stages run and their settings are
parameters. ``sharing_chain`` takes the memory plan's (``placement`` = "sharing_pipeline",
``placement_params``, ``interval_s``, ``alpha_mb``, ``lookahead_intervals``,
``priority_features``: ``scheduler.policies.exec_plan``) and passes the others to the
pipeline: stage 1 ``features``, ``gpu_share_slowdown``, ``exact_split_limit``
(``scheduler.policies.placement_rate``); stage 2 ``fallback``, ``mig_relayout_s``,
``sensitivity_high``, ``cm_threshold`` (``scheduler.policies.sharing_mode``); stage 3
``pairing`` (bool, True: off skips the stage), ``base_epc``, ``max_epc``, ``l1_threshold``
(``scheduler.policies.kscheduler``).

``sharing_pipeline`` is stages 1-3 alone (registered too, for comparisons).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from scheduler.classes import cm_class
from scheduler.domain import ClusterState, JobSpec, SharingMode
from scheduler.kernels import is_kernel
from scheduler.policies.exec_plan import ExecPlanPolicy, exec_plan_defaults
from scheduler.policies.framework import Candidate, WorkingView
from scheduler.policies.kscheduler import KSchedulerPolicy
from scheduler.policies.placement_rate import DEFAULT_FEATURES, PlacementRatePolicy
from scheduler.policies.sharing_mode import (
    SharingCandidate,
    SharingModePolicy,
    sharing_defaults,
)

_SHARED = (SharingMode.MPS, SharingMode.TIME_SLICING)


class SharingPipelinePolicy(SharingModePolicy):
    """Stages 1-3 of the chain (module docstring)."""

    name: ClassVar[str] = "sharing_pipeline"
    defaults: ClassVar[Mapping[str, Any]] = {
        **sharing_defaults,
        "features": dict(DEFAULT_FEATURES),
        "gpu_share_slowdown": None,
        "exact_split_limit": 200,
        "pairing": True,
        "base_epc": 1.0,
        "max_epc": 4.0,
        "l1_threshold": 10.0,
    }

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        self.rate = PlacementRatePolicy(
            features=p["features"],
            gpu_share_slowdown=p["gpu_share_slowdown"],
            exact_split_limit=p["exact_split_limit"],
            max_jobs_per_gpu=p["max_jobs_per_gpu"],
        )
        self.pairs = KSchedulerPolicy(
            base_epc=p["base_epc"],
            max_epc=p["max_epc"],
            l1_threshold=p["l1_threshold"],
            max_jobs_per_gpu=max(2, int(p["max_jobs_per_gpu"]) + 1),
        )

    def begin_cycle(self, state: ClusterState, view: WorkingView) -> None:
        super().begin_cycle(state, view)
        self._cycle = self.rate.split(state)

    def sort_queue(
        self, pending: Sequence[JobSpec], view: WorkingView, rng: random.Random
    ) -> list[JobSpec]:
        return list(self._cycle.order) if self._cycle.order else list(pending)

    def feasibility_key(self, job: JobSpec) -> Any:
        return (self._cycle.side.get(job.id), super().feasibility_key(job))

    def candidates(self, job: JobSpec, view: WorkingView) -> list[Candidate]:
        side = self._cycle.side.get(job.id)
        if side == "cpu":
            return self._cpu_candidates(job, view)
        if side == "gpu":
            return super().candidates(job, view)
        return []

    def pairing_problem(self, job: JobSpec, residents: Sequence[JobSpec], cand: Candidate) -> str:
        """Why ``job`` pairs badly with ``residents`` on ``cand``'s GPU ("" if it does not)."""
        if not residents or cand.mode not in _SHARED:
            return ""
        if is_kernel(job.profile) and all(is_kernel(r.profile) for r in residents):
            spec = cand.gpus[0].spec if cand.gpus else None
            return self.pairs.rules(list(residents), job, spec) or ""
        if cm_class(job.profile, threshold=self.cm_threshold) == "M" and any(
            cm_class(r.profile, threshold=self.cm_threshold) == "M" for r in residents
        ):
            return "two memory-intensive jobs together"
        return ""

    def rank(self, job: JobSpec, cand: SharingCandidate) -> None:
        super().rank(job, cand)
        if not self.params.get("pairing", True):
            return
        problem = self.pairing_problem(job, cand.gpus[0].jobs if cand.gpus else [], cand)
        if problem:
            cand.tier += 2  # a last resort, after every candidate that pairs well
            cand.why += f"; pairing: {problem}, taken as a last resort"

    def explain(
        self, job: JobSpec, chosen: Candidate, cands: list[Candidate], view: WorkingView
    ) -> str:
        c = self._cycle
        rank = (
            f"rate {c.rate.get(job.id, 0.0):.3f} ({c.position.get(job.id, 0)} of {c.n}, "
            f"{self._cycle.side.get(job.id)} side)"
        )
        if not chosen.gpus:
            return f"{rank}; placed {self.placement_text(job, chosen)}: CPU side"
        text = super().explain(job, chosen, cands, view)
        pairing = ""
        shares = bool(chosen.gpus[0].jobs) and chosen.mode in _SHARED
        if not self.params.get("pairing", True):
            pairing = "; pairing: off"
        elif isinstance(chosen, SharingCandidate) and "pairing:" not in chosen.why and shares:
            pairing = "; pairing: fits its co-runners"
        return f"{rank}; mode: {text}{pairing}"


class SharingChainPolicy(ExecPlanPolicy):
    """The four stages: ``sharing_pipeline`` wrapped in the memory plan (module docstring)."""

    name: ClassVar[str] = "sharing_chain"
    defaults: ClassVar[Mapping[str, Any]] = {
        **exec_plan_defaults,
        "placement": "sharing_pipeline",
    }
