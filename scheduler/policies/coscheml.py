"""``coscheml``: co-location by predicted interference (ALGORITHMS.md §2, thesis 003 Algorithm 1).

Algorithm 1, invoked on every arrival and completion (the simulator and the live loop call the
policy on both), for the pending jobs in queue order:

1. A job that fits an **idle GPU** takes the first one in cluster order (lines 4-5): while GPUs
   are idle, jobs are spread, each alone on its GPU. CPU jobs take the first CPU node that fits;
   multi-GPU jobs take whole idle GPUs of one node (the framework's rule: they never share).
2. Once a single-GPU job finds no idle GPU, the policy ranks **every pair** of a pending
   single-GPU job (this one and every later one) with a GPU running fewer than
   ``max_jobs_per_gpu`` jobs (default 2: "apps running alone", line 7) by its predicted
   interference, ascending (lines 9-10), and selects pairs greedily: a pair is taken when
   neither side is taken yet and ``can_co_schedule`` holds (lines 11, 28-35). A job in a
   selected pair goes to its partner's GPU (lines 12-13); a job in no selected pair waits, with
   the reason (line 17).
3. ``can_co_schedule(job, GPU)`` predicts an out-of-memory: the job's profiled maximum memory
   (``JobSpec.memory_need_mb``: asked, else profiled max) plus what the GPU holds now (the larger
   of the residents' committed needs and the *monitored* use, ``GpuState.used_memory_mb``) plus
   ``memory_margin_mb`` must fit the GPU's memory. A pair the model predicts cannot co-run at all
   (``learned``: feasibility classifier; ``measured``: infeasible) is never taken either.

**Interference value of a pair.** The thesis' model returns one application's co-run time /
solo time and does not say which side the sorted value is. Our reading: the mean, over every
job that would share the GPU, of its predicted concurrent slowdown (MPS-like: the model's whole
co-run slowdown, ``scheduler.interference``) next to the others. For two jobs that is
``(s(new | resident) + s(resident | new)) / 2``: a pair where either side suffers ranks low.

**The model.** By default the trained model (``learned``, ``scheduler.learning``): ``model``
names it ("active": the portal's activated model, else the built-in one trained on the shipped
Gavel measurements; "builtin"; "file:PATH"). Predictions are cached per profile pair, so a cycle
calls scikit-learn once for the pairs it has not seen yet and not at all afterwards.
``predictor`` replaces the model by any registered interference model: ``"measured"`` feeds the
policy the measured pairs themselves (an upper bound for the learned model; the simulator's
ground truth is that same table, so this is only for comparisons). A policy never reads the
simulator's truth otherwise: the framework's ``colocation_check`` is off by default here
(``None``); set it to "measured" to add the framework's filter of measured-infeasible pairs.

Explanations name the partner, the predicted slowdowns, the pair's rank among the pairs
ranked, the memory check and the model ("paired with job 88 on n1/gpu0 under MPS: predicted
slowdown 1.12 (this job 1.10, job 88 1.14), lowest of 14 pairs; memory 9.1 of 12.0 GB ...").

Parameters (besides the framework's; ``colocation_check`` defaults to None here):

- ``model`` (str, "active"): which trained model (see above).
- ``predictor`` (str or None, None): a registered interference model to use instead of the
  trained one; ``predictor_params`` (mapping or None) its parameters.
- ``memory_margin_mb`` (MB, 0): safety margin of ``can_co_schedule``.
- ``max_predicted_slowdown`` (float or None, None): never take a pair whose interference value
  exceeds this (None: as the thesis, any pair may be taken).
- ``min_feasible`` (0..1, 0.5): the trained model's feasibility classifier must give a pair at
  least this probability of co-running at all, else the pair counts as an OOM (learned model
  only). 0.5 is the classifier's own decision boundary; a higher value trades co-location for
  fewer OOM restarts (docs/coscheml.md shows both on the held-out pairs).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any, ClassVar

from scheduler.domain import ClusterState, GpuSpec, JobSpec, Plan, SharingMode
from scheduler.interference import InterferenceError, InterferenceModel, build_interference
from scheduler.policies.base import PolicyError
from scheduler.policies.framework import (
    Candidate,
    FrameworkPolicy,
    WorkGpu,
    WorkingView,
    framework_defaults,
    gb,
    job_type_key,
)

_CONCURRENT = SharingMode.MPS  # the model's whole co-run slowdown (scheduler.interference)


class _Pairing:
    """The greedy selection of one cycle: job id -> (GPU, candidate template, pair facts)."""

    def __init__(self) -> None:
        self.assigned: dict[str, tuple[WorkGpu, Candidate, dict[str, Any]]] = {}
        self.why_not: dict[str, str] = {}
        self.pairs = 0


class CoschemlPolicy(FrameworkPolicy):
    name: ClassVar[str] = "coscheml"
    defaults: ClassVar[dict[str, Any]] = {
        **framework_defaults,
        "colocation_check": None,
        "model": "active",
        "predictor": None,
        "predictor_params": None,
        "memory_margin_mb": 0.0,
        "max_predicted_slowdown": None,
        "min_feasible": 0.5,
    }
    colocate: ClassVar[bool] = True
    scorers: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        try:
            margin = float(p["memory_margin_mb"])
        except (TypeError, ValueError):
            raise PolicyError("policy 'coscheml': memory_margin_mb must be a number") from None
        if margin < 0:
            raise PolicyError("policy 'coscheml': memory_margin_mb must be >= 0")
        self.memory_margin_mb = margin
        limit = p["max_predicted_slowdown"]
        if limit is not None and (not isinstance(limit, int | float) or limit < 1.0):
            raise PolicyError("policy 'coscheml': max_predicted_slowdown must be >= 1 or None")
        self.max_predicted_slowdown = None if limit is None else float(limit)
        try:
            if p["predictor"]:
                self.model: InterferenceModel = build_interference(
                    str(p["predictor"]), **dict(p["predictor_params"] or {})
                )
            else:
                self.model = build_interference(
                    "learned", model=p["model"], min_feasible=p["min_feasible"]
                )
        except InterferenceError as exc:
            raise PolicyError(f"policy 'coscheml': {exc}") from None
        predictor = getattr(self.model, "predictor", None)
        self.model_text = (
            predictor.summary() if predictor is not None else f"{self.model.name} interference"
        )
        self._order: list[JobSpec] = []
        self._pos: dict[str, int] = {}
        self._pairing: _Pairing | None = None
        self._state: ClusterState | None = None
        self._monitored: dict[tuple[str, int], float] | None = None
        self._slowdowns: dict[tuple[Any, ...], float] = {}

    # -- the cycle -----------------------------------------------------------------------------

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        self._state = state
        self._pairing = None
        self._monitored = None
        self._slowdowns = {}
        plan = super().schedule(state, rng)
        pairing = self._pairing
        if pairing is None or not pairing.why_not:
            return plan
        waiting = dict(plan.waiting)
        for job_id, text in pairing.why_not.items():
            if job_id in waiting:  # the pairing's reason beats "no shared GPU below its limit"
                waiting[job_id] = text
        return Plan(decisions=plan.decisions, actions=plan.actions, waiting=waiting)

    def sort_queue(
        self, pending: Sequence[JobSpec], view: WorkingView, rng: random.Random
    ) -> list[JobSpec]:
        """Queue order (Algorithm 1 runs per job as they arrive)."""
        self._order = list(pending)
        self._pos = {j.id: i for i, j in enumerate(self._order)}
        return self._order

    def pick(
        self, job: JobSpec, cands: list[Candidate], view: WorkingView, rng: random.Random
    ) -> Candidate | None:
        """An idle GPU (or CPU node, or whole GPUs) first in cluster order; else the GPU of the
        job's selected pair, if any."""
        first = min(cands, key=lambda c: c.order)
        if job.gpus != 1 or not first.gpus:
            return first
        idle = [c for c in cands if not c.residents]
        if idle:
            return min(idle, key=lambda c: c.order)
        pairing = self._pairing
        if pairing is None:
            pairing = self._pairing = self._select_pairs(job, view)
        hit = pairing.assigned.get(job.id)
        if hit is None:
            return None
        gpu, template, facts = hit
        chosen = Candidate(gpu.node, (gpu,), template.mode, template.mig_profile, template.pool)
        chosen.score = -facts["value"]
        chosen.raw = {"predicted_slowdown": facts["value"]}
        return chosen

    # -- Algorithm 1, lines 7-13 and 18-35 -----------------------------------------------------

    def pair_slowdown(self, job: JobSpec, others: Sequence[JobSpec], spec: GpuSpec) -> float:
        """Predicted concurrent slowdown of ``job`` next to ``others`` (memoised per cycle by
        job types and GPU model)."""
        key = (job_type_key(job), tuple(job_type_key(o) for o in others), spec.model)
        value = self._slowdowns.get(key)
        if value is None:
            value = self.model.slowdown(job, others, spec, _CONCURRENT)
            self._slowdowns[key] = value
        return value

    def pair_value(
        self, job: JobSpec, residents: Sequence[JobSpec], spec: GpuSpec
    ) -> tuple[float, float, list[float]]:
        """(interference value, the new job's slowdown, each resident's slowdown) of placing
        ``job`` next to ``residents`` (module docstring)."""
        mine = self.pair_slowdown(job, residents, spec)
        theirs = [
            self.pair_slowdown(r, [*residents[:i], *residents[i + 1 :], job], spec)
            for i, r in enumerate(residents)
        ]
        every = [mine, *theirs]
        value = math.inf if any(math.isinf(s) for s in every) else sum(every) / len(every)
        return value, mine, theirs

    def monitored_mb(self, gpu: WorkGpu) -> float | None:
        """The GPU's monitored memory use (MB) in this cycle's snapshot, if known."""
        if self._monitored is None:
            self._monitored = {}
            if self._state is not None:
                for node in self._state.nodes:
                    for g in node.gpus:
                        if g.job_ids and g.used_memory_mb is not None:
                            self._monitored[(node.name, g.index)] = g.used_memory_mb
        return self._monitored.get((gpu.node.name, gpu.index))

    def can_co_schedule(self, job: JobSpec, gpu: WorkGpu, mode: SharingMode) -> tuple[bool, str]:
        """Whether ``job`` joining ``gpu`` is predicted to stay in memory, and the figures:
        profiled max + max(committed, monitored) + margin <= GPU memory (MIG instances were
        sized by the framework's filter)."""
        if mode == SharingMode.MIG:
            return True, "in its own MIG instance"
        need = job.memory_need_mb()
        seen = self.monitored_mb(gpu)
        held = max(gpu.committed_mb, seen or 0.0)
        total = need + held + self.memory_margin_mb
        cap = gpu.spec.memory_mb
        text = f"memory {gb(need + held)} of {gb(cap)} GB (this job {gb(need)} + "
        text += (
            f"{gb(held)} in use, monitored)"
            if seen is not None and seen > gpu.committed_mb
            else f"{gb(held)} held)"
        )
        return total <= cap + 1e-6, text

    def _select_pairs(self, job: JobSpec, view: WorkingView) -> _Pairing:
        """Rank (pending job, GPU below its job limit) pairs by interference value and select
        greedily (Algorithm 1 lines 7-11, 18-35), for ``job`` and every later single-GPU job."""
        out = _Pairing()
        start = self._pos.get(job.id, 0)
        groups: dict[tuple[Any, ...], list[JobSpec]] = {}
        for j in self._order[start:]:
            if j.gpus == 1:
                groups.setdefault((self.shape(j), job_type_key(j)), []).append(j)
        # (value, queue position, GPU order, group, candidate, facts)
        entries: list[tuple[float, int, int, tuple[Any, ...], Candidate, dict[str, Any]]] = []
        wanted: list[tuple[JobSpec, JobSpec, GpuSpec]] = []
        shared_by_group: dict[tuple[Any, ...], list[Candidate]] = {}
        for key, jobs in groups.items():
            rep = jobs[0]
            cands = [c for c in self.candidates(rep, view) if c.residents and c.gpus]
            cands = [c for c in cands if self.keep(rep, c, view)]
            shared_by_group[key] = cands
            for c in cands:
                for r in c.residents:
                    wanted.append((rep, r, c.gpus[0].spec))
                    wanted.append((r, rep, c.gpus[0].spec))
        prefetch = getattr(self.model, "prefetch", None)
        if prefetch is not None:
            prefetch(wanted)
        for key, cands in shared_by_group.items():
            rep = groups[key][0]
            for c in cands:
                if c.mode == SharingMode.MIG:
                    value, mine, theirs = 1.0, 1.0, [1.0 for _ in c.residents]
                else:
                    value, mine, theirs = self.pair_value(rep, c.residents, c.gpus[0].spec)
                facts = {"value": value, "mine": mine, "theirs": theirs}
                entries.append((value, self._pos[rep.id], c.order, key, c, facts))
        entries.sort(key=lambda e: (e[0], e[1], e[2]))
        counts = [len(groups[e[3]]) * len(e[4].pool or e[4].gpus) for e in entries]
        out.pairs = sum(counts)
        taken: set[int] = set()
        planned_cores: dict[int, int] = {}
        memory_text: dict[tuple[Any, ...], str] = {}
        best: dict[tuple[Any, ...], tuple[float, Candidate]] = {}
        rank = 1
        limit = self.max_predicted_slowdown
        for (value, _pos, _order, key, cand, facts), count in zip(entries, counts, strict=True):
            best.setdefault(key, (value, cand))
            first_rank, rank = rank, rank + count
            if math.isinf(value) or (limit is not None and value > limit):
                continue
            jobs = [j for j in groups[key] if j.id not in out.assigned]
            if not jobs:
                continue
            k = 0
            for gpu in cand.pool or list(cand.gpus):
                if k >= len(jobs):
                    break
                if id(gpu) in taken:
                    continue
                j = jobs[k]
                node = gpu.node
                if node.cores > 0 and node.free_cores - planned_cores.get(node.order, 0) < j.cpus:
                    continue
                ok, mem = self.can_co_schedule(j, gpu, cand.mode)
                if not ok:
                    memory_text.setdefault(key, mem)
                    continue
                taken.add(id(gpu))
                planned_cores[node.order] = planned_cores.get(node.order, 0) + j.cpus
                out.assigned[j.id] = (
                    gpu,
                    cand,
                    {**facts, "rank": first_rank, "memory": mem, "residents": list(gpu.jobs)},
                )
                k += 1
        for key, jobs in groups.items():
            if key not in best:
                continue  # no GPU had room: the framework's reason (with numbers) stands
            for j in jobs:
                if j.id not in out.assigned:
                    out.why_not[j.id] = self._why_not(j, key, best, memory_text, out.pairs)
        return out

    def _why_not(
        self,
        job: JobSpec,
        key: tuple[Any, ...],
        best: dict[tuple[Any, ...], tuple[float, Candidate]],
        memory_text: dict[tuple[Any, ...], str],
        pairs: int,
    ) -> str:
        head = f"no idle GPU fits; {pairs} pairs with GPUs running one job ranked by predicted "
        head += f"slowdown ({self.model_text})"
        value, cand = best[key]
        where = f"{cand.label} with " + ", ".join(f"job {r.id}" for r in cand.residents)
        if math.isinf(value):
            return (
                f"{head}: the model predicts this job cannot co-run with any of them (e.g. {where})"
            )
        limit = self.max_predicted_slowdown
        if limit is not None and value > limit:
            return (
                f"{head}: its best pair ({where}, {value:.2f}) is above max_predicted_slowdown "
                f"{limit:.2f}"
            )
        if key in memory_text:
            return (
                f"{head}: can_co_schedule predicts an OOM on the GPUs left for it, e.g. "
                f"{memory_text[key]}"
            )
        return (
            f"{head}: the GPUs went to lower-interference pairs; its best was {value:.2f} "
            f"({where}); waits for the next arrival or completion"
        )

    # -- explanations --------------------------------------------------------------------------

    def explain(
        self, job: JobSpec, chosen: Candidate, cands: list[Candidate], view: WorkingView
    ) -> str:
        where = self.placement_text(job, chosen)
        if not chosen.gpus:
            n = sum(c.pool_size for c in cands)
            return f"placed {where}: first CPU node that fits ({n} fit)"
        if len(chosen.gpus) > 1:
            return self.whole_gpus_text(job, chosen, cands)
        pairing = self._pairing
        hit = pairing.assigned.get(job.id) if pairing is not None else None
        if not chosen.residents or hit is None:
            idle = sum(c.pool_size for c in cands if not c.residents)
            return (
                f"placed {where}: an idle GPU, first of {idle} that fit (Algorithm 1 spreads "
                f"jobs over idle GPUs before pairing); {self.fit_text(job, chosen)}"
            )
        facts = hit[2]
        residents = facts["residents"]
        partner = ", ".join(f"job {r.id}" for r in residents)
        detail = ", ".join(
            f"job {r.id} {s:.2f}" for r, s in zip(residents, facts["theirs"], strict=True)
        )
        rank = "lowest" if facts["rank"] == 1 else f"rank {facts['rank']}"
        pairs = pairing.pairs if pairing is not None else 0
        return (
            f"paired with {partner} ({', '.join(job_type_key(r) for r in residents)}) {where}: "
            f"predicted slowdown {facts['value']:.2f} (this job {facts['mine']:.2f}, {detail}), "
            f"{rank} of {pairs} pairs; {facts['memory']}; model {self.model_text}"
        )
