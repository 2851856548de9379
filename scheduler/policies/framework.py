"""A scheduling-framework-style base class: sort, filter, score, pick, reserve, explain.

In the spirit of the Kubernetes scheduling framework (DESIGN.md, STYLE.md): a small core runs a
serial decision cycle over ``state.pending`` and calls extension points a policy overrides:

- ``sort_queue(pending, view, rng)``: the order jobs are considered in (default: queue order).
- ``candidates(job, view)``: the feasible placements (filter). The default covers CPU jobs,
  single-GPU jobs (exclusive on an idle GPU, or co-located when ``colocate`` is set),
  multi-GPU jobs (``k`` idle GPUs of one model on one node, exclusive) and gangs (a job
  larger than any node: ``k`` idle GPUs of one model over several nodes, all or nothing).
- ``keep(job, candidate, view)``: an extra per-candidate filter (default: keep all).
- ``score_<name>(job, candidate, view)`` for each name in ``scorers``: raw scores, higher is
  better. With several scorers each is min-max normalised to 0..100 over the candidates and
  combined with the weights in the ``weights`` parameter (default 1 each); ties go to the
  candidate first in cluster order (nodes in snapshot order, then GPU index).
- ``pick(job, scored, view, rng)``: the winner (default: best score, first in order).
- ``explain(job, chosen, scored, view)``: the human-readable reason, with numbers;
  ``explain_gang`` for a gang (the default names the nodes, why not one, and the speed).

Where the pieces are (one idea per module):

- this module: ``FrameworkPolicy``, the cycle (``schedule``) and the extension points, and
  ``framework_defaults``;
- ``scheduler.policies.candidate``: ``Candidate`` and the per-cycle copies of GPUs and nodes
  (``WorkGpu``, ``WorkNode``) it is made of;
- ``scheduler.policies.working_view``: ``WorkingView``, the snapshot's capacity indexed in
  pools and buckets, refreshed between cycles, and the predicted ends of the running jobs;
- ``scheduler.policies.filtering``: the default filter (which placements a job may get, the
  feasibility rules) and why a job gets none;
- ``scheduler.policies.gangs``: jobs larger than any node, placed all or nothing;
- ``scheduler.policies.reservations``: EASY reservations (``reserve``);
- ``scheduler.policies.explanations``: the texts of decisions and waiting reasons.

A cycle with no pending job returns an empty plan at once. With ``backfill`` off, the first job
that cannot be placed blocks the rest of the queue; with it on (and ``reserve``), the first
waiting multi-GPU job may hold an EASY reservation of the GPUs predicted idle first.

Common parameters (``framework_defaults``; policies add their own):

- ``backfill`` (bool, True): let later jobs go past one that does not fit.
- ``reserve`` (bool, False): with ``backfill`` on, give the first waiting multi-GPU job an
  EASY reservation that later jobs may not delay (see the feasibility rules). Off, a stream
  of small jobs can keep a large one waiting indefinitely.
- ``max_jobs_per_gpu`` (int, 2): co-location limit under MPS and time-slicing.
- ``share_mode`` (str, "auto"): mode for an idle GPU a co-locating policy starts sharing:
  "auto", "mps", "time_slicing" or "mig".
- ``profiled_models_only`` (bool, True): see above.
- ``weights`` (mapping scorer name -> weight, None = 1 each).
- ``interference`` (str or None, None): a registered interference model name
  (``scheduler.interference.build_interference``) whose predicted slowdown co-locating policies
  quote in explanations; ``interference_params`` (mapping, None) its parameters.
- ``colocation_check`` (str or None, "knowledge"): what the filter asks whether a pair can
  co-run at all (see the feasibility rules). ``"knowledge"``: the snapshot's knowledge
  (``ClusterState.knowledge``; its pair prior, e.g. Gavel's table, which knows the Gavel job
  types only, so other jobs pass), never the simulator's truth; a registered interference model
  name asks that model instead (when it names the same model as ``interference``, that
  instance and its parameters); None turns the check off.
- ``unconsolidated_speed`` (float, 0.74 = ``scheduler.domain.UNCONSOLIDATED_SPEED``): speed of
  a gang relative to one node where its profile has no unconsolidated time (the median of
  Gavel's measured ratios); used in explanations and predicted ends, an estimate only.
- ``cpu_jobs_on_gpu_nodes`` (bool, True): a job asking for no GPU may run on a GPU node's spare
  cores (its free cores less one per idle GPU, ``spare_cores``), after every CPU node on equal
  scores; the node hides every GPU device from it and its cores count against the node.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from scheduler.domain import (
    UNCONSOLIDATED_SPEED,
    ClusterState,
    Decision,
    GpuSpec,
    JobSpec,
    Plan,
    SharingMode,
)
from scheduler.interference import InterferenceModel, build_interference
from scheduler.policies import explanations, filtering, gangs, reservations
from scheduler.policies.base import Policy, PolicyError
from scheduler.policies.candidate import (
    Candidate,
    Part,
    WorkGpu,
    WorkNode,
    job_type_key,
    mps_owners,
    spare_cores,
)
from scheduler.policies.explanations import duration_text, gb, memory_basis, request_text
from scheduler.policies.filtering import oom_beside
from scheduler.policies.reservations import Reservation
from scheduler.policies.working_view import WorkingView

# The names other modules, tests and docs import from here (they moved to the modules above).
__all__ = [
    "GPU_MODEL_PARAM",
    "NO_CONTAINER_RUNTIME",
    "Candidate",
    "FrameworkPolicy",
    "Part",
    "Reservation",
    "WorkGpu",
    "WorkNode",
    "WorkingView",
    "duration_text",
    "framework_defaults",
    "gb",
    "job_type_key",
    "memory_basis",
    "mps_owners",
    "oom_beside",
    "request_text",
    "spare_cores",
]

#: A job parameter naming the one GPU model the job may run on.
GPU_MODEL_PARAM = "gpu_model"

framework_defaults: dict[str, Any] = {
    "backfill": True,
    "reserve": False,
    "max_jobs_per_gpu": 2,
    "share_mode": "auto",
    "profiled_models_only": True,
    "weights": None,
    "interference": None,
    "interference_params": None,
    "colocation_check": "knowledge",
    "unconsolidated_speed": UNCONSOLIDATED_SPEED,
    # A job asking for no GPU may run on a GPU node's spare cores (after every CPU node; the
    # node hides every GPU device from it): docs/policies.md.
    "cpu_jobs_on_gpu_nodes": True,
}

# ``FrameworkPolicy.schedule``'s failure cache entry of a job kept off reserved GPUs (its
# text names the job's own predicted run time, so it is written per job).
_DELAYS_RESERVATION = "\0delays-reservation"
# The waiting reason of a container job while no up node has a container runtime.
NO_CONTAINER_RUNTIME = "no node has a container runtime (docs/containers.md)"


class FrameworkPolicy(Policy):
    """Base of the policies that run the framework's serial decision cycle (see module doc).

    Subclasses set ``name``, ``defaults`` (include ``framework_defaults``), ``colocate``,
    ``scorers`` and implement the ``score_<name>`` methods and ``explain``.
    """

    colocate: ClassVar[bool] = False
    scorers: ClassVar[tuple[str, ...]] = ()
    defaults: ClassVar[Mapping[str, Any]] = framework_defaults

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        if p.get("share_mode", "auto") not in ("auto", "mps", "time_slicing", "mig"):
            raise PolicyError(
                f"policy {self.name!r}: share_mode must be auto, mps, time_slicing or mig; "
                f"got {p['share_mode']!r}"
            )
        if int(p.get("max_jobs_per_gpu", 1)) < 1:
            raise PolicyError(f"policy {self.name!r}: max_jobs_per_gpu must be >= 1")
        speed = p.get("unconsolidated_speed", UNCONSOLIDATED_SPEED)
        if not isinstance(speed, int | float) or isinstance(speed, bool) or not 0 < speed <= 10:
            raise PolicyError(
                f"policy {self.name!r}: unconsolidated_speed must be a number in (0, 10], "
                f"got {speed!r}"
            )
        self.unconsolidated_speed = float(speed)
        weights = p.get("weights") or {}
        unknown = set(weights) - set(self.scorers)
        if unknown:
            raise PolicyError(
                f"policy {self.name!r} has no scorer(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(self.scorers) or 'none'}"
            )
        self.weights = {s: float(weights.get(s, 1.0)) for s in self.scorers}
        # The working view is kept between cycles and refreshed (``WorkingView.refresh``):
        # a policy object serves one scheduling loop at a time (not thread-safe).
        self._view: WorkingView | None = None
        self._oom_seen = False  # some job of this cycle carries OOM kills (``schedule``)
        self.interference: InterferenceModel | None = None
        if p.get("interference"):
            self.interference = build_interference(
                p["interference"], **dict(p.get("interference_params") or {})
            )
        self.colocation_check: InterferenceModel | None = None
        check = p.get("colocation_check")
        # "knowledge": a ``filtering.KnowledgeCheck`` on each cycle's snapshot (``schedule``).
        self._check_by_knowledge = bool(self.colocate and check == "knowledge")
        if self._check_by_knowledge:
            self.colocation_check = filtering.KnowledgeCheck(filtering.table_knowledge())
        elif self.colocate and check and check != "none":
            if self.interference is not None and check == p.get("interference"):
                self.colocation_check = self.interference
            else:
                self.colocation_check = build_interference(str(check))

    # -- the cycle -----------------------------------------------------------------------------

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        if not state.pending:
            # Nothing to decide (the simulator calls on every completion): skip the view,
            # whose construction is linear in the GPUs.
            return Plan()
        view = self._view
        if view is None:
            view = self._view = WorkingView(state, colocate=self.colocate)
        else:
            view.refresh(state)
        # A job's type decides where it may go once some job carries OOM kills (``oom_beside``):
        # the failure cache (``shape``) must then tell types apart.
        self._oom_seen = any(j.oom_with for j in state.pending) or any(
            r.job.oom_with for r in state.running
        )
        if self._check_by_knowledge:
            self.colocation_check = filtering.KnowledgeCheck(
                state.knowledge if state.knowledge is not None else filtering.table_knowledge()
            )
        self.begin_cycle(state, view)
        decisions: list[Decision] = []
        waiting: dict[str, str] = {}
        blocked_by: JobSpec | None = None
        backfill = bool(self.params.get("backfill", True))
        reserving = backfill and bool(self.params.get("reserve", False))
        held: Reservation | None = None  # this cycle's reservation, once made
        unreservable: set[tuple[Any, ...]] = set()  # shapes that could get none this cycle
        for job in self.sort_queue(state.pending, view, rng):
            if job.container and not view.container_nodes_up():
                waiting[job.id] = NO_CONTAINER_RUNTIME
                continue
            # A container job sees only the nodes with a container runtime.
            barred = view.bar_without_containers() if job.container else []
            try:
                if blocked_by is not None:
                    waiting[job.id] = (
                        f"waiting behind job {blocked_by.id}, which does not fit yet "
                        f"(strict queue order, backfill off)"
                    )
                    continue
                shape = self.shape(job)
                # Behind a reservation: "short" jobs (predicted to end before it starts) see its
                # idle GPUs, "long" ones do not; "other" jobs cannot use its GPU model anyway.
                regime = self.reservation_regime(job, held, view) if held is not None else "other"
                if held is not None and regime == "short":
                    view.show_idle(held.work)
                chosen, cands, reason = self._decide(job, shape, regime, held, view, rng)
                if chosen is not None:
                    if chosen.is_gang:
                        explanation = self.explain_gang(job, chosen, cands, view)
                    else:
                        explanation = self.explain(job, chosen, cands, view)
                    if chosen.gpus:
                        explanation += request_text(job, chosen)
                    placement = view.reserve(job, chosen)
                    decisions.append(Decision(placement, self.name, explanation, chosen.score))
                if held is not None and regime == "short":
                    view.hide(held.work)
                if chosen is not None:
                    continue
                if reason == _DELAYS_RESERVATION and held is not None:
                    reason = self.delay_text(job, held, view)
                if reserving and held is None and job.gpus > 1 and shape not in unreservable:
                    held = self.make_reservation(job, view)
                    if held is None:
                        unreservable.add(shape)
                    else:
                        view.hide(held.work)
                        reason = (
                            f"holds a reservation of {held.text}; jobs behind it may start on "
                            f"these GPUs only if predicted to end by then; "
                            f"{reason or 'no feasible placement'}"
                        )
                reason = reason or "no feasible placement"
                if job.container:
                    reason = f"a container job, on nodes with a container runtime: {reason}"
                waiting[job.id] = reason + request_text(job, None)
                if not backfill:
                    blocked_by = job
            finally:
                view.unbar(barred)
        return Plan(decisions=tuple(decisions), waiting=waiting)

    def _decide(
        self,
        job: JobSpec,
        shape: tuple[Any, ...],
        regime: str,
        held: Reservation | None,
        view: WorkingView,
        rng: random.Random,
    ) -> tuple[Candidate | None, list[Candidate], str | None]:
        """Filter, score and pick for one job: (the chosen candidate or None, the candidates,
        why it waits). Failures are cached per shape (and per reservation regime)."""
        key = shape if regime == "other" else (*shape, regime)
        reason = view.failures.get(key)
        cands: list[Candidate] = []
        if reason is None:
            fitting = [
                c
                for c in self.candidates(job, view)
                if self.keep(job, c, view) and (not job.container or c.in_containers())
            ]
            cands = self.honour_request(job, fitting)
            if fitting and not cands:
                reason = self.request_refusal(job, fitting)
                view.failures[key] = reason
            elif not cands:
                if regime == "long" and held is not None:
                    # Kept off the reserved GPUs: would it fit on them?
                    view.show_idle(held.work)
                    wider = any(self.keep(job, c, view) for c in self.candidates(job, view))
                    reason = _DELAYS_RESERVATION if wider else self.no_fit_reason(job, view)
                    view.hide(held.work)
                else:
                    reason = self.no_fit_reason(job, view)
                view.failures[key] = reason
        chosen = None
        if cands:
            self.score_candidates(job, cands, view)
            chosen = self.pick(job, cands, view, rng)
            if chosen is None:
                reason = f"{self.name}: no acceptable placement among {len(cands)} candidates"
        return chosen, cands, reason

    # -- EASY reservations (``reserve``) -------------------------------------------------------

    # -- EASY reservations (``reserve``; ``scheduler.policies.reservations``) -----------------

    def predicted_run_s(self, job: JobSpec, model: str, *, spread: bool) -> float | None:
        """What the policy predicts ``job`` runs on ``model`` (s), with its
        ``unconsolidated_speed`` (``reservations.predicted_run_s``)."""
        return reservations.predicted_run_s(
            job, model, spread=spread, speed=self.unconsolidated_speed
        )

    def reservation_regime(self, job: JobSpec, held: Reservation, view: WorkingView) -> str:
        """How ``job`` stands to the reservation ``held``: "other" (it cannot use its GPU
        model: memory, profiled models, or a CPU job), "short" (predicted to end before the
        reservation starts: it may use the reserved idle GPUs) or "long" (it may not)."""
        if job.gpus <= 0:
            return "other"
        spec = view.specs[held.sid]
        allowed = self.allowed_models(job)
        if spec.memory_mb < job.memory_need_mb() or (
            allowed is not None and spec.model not in allowed
        ):
            return "other"
        spread = job.gpus > 1 and not self.one_node_holds(job, view)
        run = self.predicted_run_s(job, spec.model, spread=spread)
        return "short" if run is not None and run <= held.start_s else "long"

    def make_reservation(self, job: JobSpec, view: WorkingView) -> Reservation | None:
        """The earliest predicted start of ``job`` (more than one GPU) and the GPUs it would
        get, or None (``reservations.earliest_reservation``)."""
        spread = not self.one_node_holds(job, view)
        return reservations.earliest_reservation(
            job,
            view,
            self.eligible_specs(job, view),
            spread=spread,
            speed=self.unconsolidated_speed,
        )

    def delay_text(self, job: JobSpec, held: Reservation, view: WorkingView) -> str:
        """Why ``job`` does not start on GPUs reserved for another job."""
        spread = job.gpus > 1 and not self.one_node_holds(job, view)
        run = self.predicted_run_s(job, held.model, spread=spread)
        return reservations.delay_text(job, held, run)

    # -- extension points ----------------------------------------------------------------------

    def begin_cycle(self, state: ClusterState, view: WorkingView) -> None:
        """Hook to precompute per-cycle data (normalisation ranges...). Default: nothing."""

    def sort_queue(
        self, pending: Sequence[JobSpec], view: WorkingView, rng: random.Random
    ) -> list[JobSpec]:
        """The order jobs are considered in. Default: queue (submission) order."""
        return list(pending)

    def shape(self, job: JobSpec) -> tuple[Any, ...]:
        """The cache key of what ``job`` needs: jobs of one shape fit or fail together."""
        return (
            job.gpus,
            job.memory_need_mb(),
            job.cpus,
            self.allowed_models(job),
            self.feasibility_key(job),
            job_type_key(job)
            if (self.colocation_check is not None or self._oom_seen) and job.gpus == 1
            else None,
            job.oom_with or None,  # observed pairs: jobs of one shape fit differently
            job.owner,  # MPS GPUs take one owner's jobs: owners fit differently
            job.container,  # container jobs see only the nodes with a runtime
            (job.sharing, job.may_share(), job.allow_cpu, job.memory_mb),  # what it allows
        )

    def feasibility_key(self, job: JobSpec) -> Any:
        """Anything job-specific a policy's ``keep`` depends on (default: None)."""
        return None

    def allowed_models(self, job: JobSpec) -> frozenset[str] | None:
        """GPU models ``job`` may run on (None: any). See ``profiled_models_only``; a job whose
        ``params`` name a ``gpu_model`` (the profiling runs, docs/profiles.md) runs on it only."""
        pinned = job.params.get(GPU_MODEL_PARAM) if job.params else None
        if pinned:
            return frozenset({str(pinned)})
        if not self.params.get("profiled_models_only", True) or job.profile is None:
            return None
        times = job.profile.gpu_time_s
        if not times:
            return None
        return frozenset(m for m, t in times.items() if t is not None and 0 < t < math.inf)

    def keep(self, job: JobSpec, cand: Candidate, view: WorkingView) -> bool:
        """Extra filter on one candidate (default: keep)."""
        return True

    def request_refusal(self, job: JobSpec, fitting: list[Candidate]) -> str:
        """Why every placement that fits ``job`` breaks what it asked
        (``filtering.request_refusal``)."""
        return filtering.request_refusal(job, fitting)

    def honour_request(self, job: JobSpec, cands: list[Candidate]) -> list[Candidate]:
        """The candidates that honour what the job asked (``filtering.honour_request``)."""
        return filtering.honour_request(job, cands)

    def fresh_mode(self, spec: GpuSpec) -> SharingMode:
        """The mode an idle GPU gets: EXCLUSIVE, or for co-locating policies ``share_mode`` if
        supported, else MPS if supported, else time-slicing."""
        if not self.colocate:
            return SharingMode.EXCLUSIVE
        wanted = self.params.get("share_mode", "auto")
        if wanted != "auto":
            mode = SharingMode(wanted)
            if spec.supports(mode) and (mode != SharingMode.MIG or spec.mig_profiles):
                return mode
        for mode in (SharingMode.MPS, SharingMode.TIME_SLICING):
            if spec.supports(mode):
                return mode
        return SharingMode.EXCLUSIVE

    def candidates(self, job: JobSpec, view: WorkingView) -> list[Candidate]:
        """The feasible placements of ``job`` (the filter step; see the module docstring)."""
        if job.gpus <= 0:
            return self._cpu_candidates(job, view)
        if job.gpus > 1:
            if self.one_node_holds(job, view):
                return self._multi_gpu_candidates(job, view)
            return self._gang_candidates(job, view)
        return self._single_gpu_candidates(job, view)

    def eligible_specs(self, job: JobSpec, view: WorkingView) -> list[int]:
        """Spec ids of the GPUs ``job`` may use: enough memory, an allowed model."""
        need, allowed = job.memory_need_mb(), self.allowed_models(job)
        return [
            sid
            for sid, spec in enumerate(view.specs)
            if spec.memory_mb >= need and (allowed is None or spec.model in allowed)
        ]

    def one_node_holds(self, job: JobSpec, view: WorkingView) -> bool:
        """Whether some up node holds ``job.gpus`` GPUs of one usable spec (and the cores),
        busy or not: then the job waits for one node and is never spread over several."""
        return any(
            view.largest_node(sid, job.cpus) >= job.gpus for sid in self.eligible_specs(job, view)
        )

    def score_candidates(self, job: JobSpec, cands: list[Candidate], view: WorkingView) -> None:
        """Fill ``cand.score``: weighted sum of the scorers, min-max normalised when several."""
        if not self.scorers:
            return
        if len(self.scorers) == 1:
            fn = getattr(self, "score_" + self.scorers[0])
            for c in cands:
                c.score = fn(job, c, view)
                c.raw[self.scorers[0]] = c.score
            return
        for c in cands:
            c.score = 0.0
        for name in self.scorers:
            fn = getattr(self, "score_" + name)
            values = [fn(job, c, view) for c in cands]
            lo, hi = min(values), max(values)
            span = hi - lo
            w = self.weights[name]
            for c, v in zip(cands, values, strict=True):
                c.raw[name] = v
                c.score += w * (100.0 * (v - lo) / span if span > 0 else 100.0)

    def pick(
        self, job: JobSpec, cands: list[Candidate], view: WorkingView, rng: random.Random
    ) -> Candidate | None:
        """The best-scored candidate; ties go to the first in cluster order."""
        best = None
        for c in cands:
            if (
                best is None
                or c.score > best.score
                or (c.score == best.score and c.rank < best.rank)
            ):
                best = c
        return best

    def explain(
        self, job: JobSpec, chosen: Candidate, cands: list[Candidate], view: WorkingView
    ) -> str:
        """Why ``chosen``: policies override; this default states the placement and fit."""
        return f"placed {self.placement_text(job, chosen)}"

    # -- helpers for explanations ------------------------------------------------------------------

    # -- helpers for explanations (``scheduler.policies.explanations``) --------------------------

    def placement_text(self, job: JobSpec, cand: Candidate) -> str:
        """ "on n3/gpu1 exclusive" (GPU) or "on cpu-0 (4 cores)" (CPU)."""
        return explanations.placement_text(job, cand)

    def fit_text(self, job: JobSpec, cand: Candidate) -> str:
        """ "needs 9.1 of 16.0 GB free" for the chosen GPU (per GPU for multi-GPU jobs)."""
        return explanations.fit_text(job, cand)

    def whole_gpus_text(self, job: JobSpec, cand: Candidate, cands: list[Candidate]) -> str:
        """Explanation for a CPU or multi-GPU placement by a co-locating policy."""
        return explanations.whole_gpus_text(job, cand, cands)

    def spread_speed_text(self, job: JobSpec, model: str) -> str:
        """ "unconsolidated speed 0.50x (measured)" (``gangs.spread_speed_text``)."""
        return gangs.spread_speed_text(job, model, self.unconsolidated_speed)

    def explain_gang(
        self, job: JobSpec, chosen: Candidate, cands: list[Candidate], view: WorkingView
    ) -> str:
        """Why a gang (several nodes): which nodes, why not one, how consolidated, how fast.
        Policies may override; the default (``gangs.gang_text``) fits every policy (gangs
        take whole idle GPUs)."""
        return gangs.gang_text(job, chosen, cands, view, self.unconsolidated_speed)

    def gang_wait_reason(self, job: JobSpec, view: WorkingView) -> str:
        """Why a gang waits, and when enough GPUs are predicted to be idle
        (``gangs.gang_wait_reason``)."""
        return gangs.gang_wait_reason(
            job,
            view,
            self.eligible_specs(job, view),
            self.allowed_models(job),
            self.unconsolidated_speed,
        )

    def residents_text(self, cand: Candidate) -> str:
        """ "with job 88 (resnet50)" or "alone for now"."""
        return explanations.residents_text(cand)

    def interference_text(self, job: JobSpec, cand: Candidate) -> str:
        """ "; predicted slowdown 1.31 (measured)" when an interference model is configured."""
        return explanations.interference_text(self.interference, job, cand)

    # -- the default filter (``scheduler.policies.filtering``) -----------------------------------

    def _cpu_candidates(self, job: JobSpec, view: WorkingView) -> list[Candidate]:
        on_gpu_nodes = bool(self.params.get("cpu_jobs_on_gpu_nodes", True))
        return filtering.cpu_candidates(job, view, on_gpu_nodes=on_gpu_nodes)

    def _multi_gpu_candidates(self, job: JobSpec, view: WorkingView) -> list[Candidate]:
        return filtering.multi_gpu_candidates(job, view, self.allowed_models(job))

    def _gang_candidates(self, job: JobSpec, view: WorkingView) -> list[Candidate]:
        return gangs.gang_candidates(job, view, self.eligible_specs(job, view))

    def _single_gpu_candidates(self, job: JobSpec, view: WorkingView) -> list[Candidate]:
        return filtering.single_gpu_candidates(
            job,
            view,
            self.allowed_models(job),
            self.fresh_mode,
            colocate=self.colocate,
            max_jobs_per_gpu=int(self.params.get("max_jobs_per_gpu", 2)),
            colocation_check=self.colocation_check,
        )

    def _co_run_ok(
        self, job: JobSpec, key: tuple[Any, ...], gpu: WorkGpu, view: WorkingView
    ) -> bool:
        """Whether ``job`` may join the residents of the shared pool ``key``
        (``filtering.co_run_ok`` with the ``colocation_check`` model)."""
        return filtering.co_run_ok(job, key, gpu, view, self.colocation_check)

    def no_fit_reason(self, job: JobSpec, view: WorkingView) -> str:
        """Why ``job`` has no candidate, with the numbers that matter (a gang:
        ``gang_wait_reason``; else ``filtering.no_fit_reason``)."""
        if job.gpus > 1 and view.gpu_count > 0 and not self.one_node_holds(job, view):
            return self.gang_wait_reason(job, view)
        check = self.colocation_check
        return filtering.no_fit_reason(
            job,
            view,
            self.allowed_models(job),
            on_gpu_nodes=bool(self.params.get("cpu_jobs_on_gpu_nodes", True)),
            colocate=self.colocate,
            max_jobs_per_gpu=int(self.params.get("max_jobs_per_gpu", 2)),
            check_name=check.name if check else "?",
        )
