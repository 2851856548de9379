"""``elastic``: fifo placement plus the autoscaling engine of seed 002 (ALGORITHMS.md §6).

Pending jobs are placed as ``fifo`` places them (exclusive GPUs, first fit), starting with the
worker count they ask (``gpus``). For every running job that declares a worker range
(``elastic_min``/``elastic_max``) and whose snapshot carries its autoscaling memory
(``RunningJob.elastic``: throughputs measured every 10 mini-batches, straggler averages), the
engine in ``scheduler.elastic`` decides, with a reason quoting the measured scaling efficiency S:

- ``REPLACE_WORKERS`` (value: the ranks) for persistent stragglers: throughput / median < 0.8
  on an EWMA, replaced by a warmed-up spare (only proposed when an idle GPU of the job's model
  is left after this cycle's placements);
- ``SET_WORKERS`` (value: ``{"workers_from", "workers", "efficiency", "local_batch"}``, and
  ``"yield_to"``: the waiting job, for a step down for the queue) to
  probe K more or fewer workers, scale up while S > threshold (and, with a utility, marginal
  utility > marginal cost), or fall back to the best point seen. A step up is only proposed
  when enough idle GPUs of the job's model exist (left after this cycle's placements).

Parameters (besides fifo's):

- ``scaling_threshold`` (0.1, the paper's): condition 1's S must exceed it.
- ``scale_step_workers`` (0): K, workers added or removed per step; 0 = the number of GPUs of
  the job's first node (the paper's "GPUs per machine").
- ``scale_interval_batches`` (50): mini-batches measured at a count before the next decision.
- ``straggler_threshold`` (0.8) and ``straggler_ewma_alpha`` (0.25, not in the paper).
- ``gpu_cost_per_hour`` (1.0) and ``lateness_value_per_hour`` (100.0): condition 2's units.
- ``yield_to_queue`` (True): give GPUs back to start a queued job (below).

**Yield to the queue** (not in the paper, which ran one job at a time). After fifo's placements,
the pending jobs left waiting are looked at in queue order (only the first one with
``backfill`` off: the others wait behind it anyway). A job W that does not fit the idle GPUs
of a model, but would fit if every elastic job on that model (a change under way or not) were
at its ``elastic_min``, is waiting for GPUs the engine added:

- no elastic job steps up onto that model this cycle (it would only have to give the GPUs back);
- elastic jobs of the model with no change under way step down by K (``step_for``; never below
  ``elastic_min``, and only to a count the engine has measured: ``engine.yield_target``), the
  job whose last step up had the lowest measured S first (its marginal GPUs are worth least to
  it; a current count not measured yet last), until W fits the idle GPUs plus the freed ones
  (their last ranks, which both executors release); jobs whose GPUs turned out not to be needed
  for the fit are dropped again, highest S first. One step per job per cycle; if one
  step each is not enough, nobody shrinks this cycle (W waits for jobs to end, and step-ups stay
  blocked). The GPUs W will take are kept from this cycle's step-ups and spares.
- nobody steps down either while a change of an elastic job of the model is under way whose
  direction the snapshot does not show (the job holds no more GPUs than its workers): on the
  live system a step down proposed in an earlier cycle looks like that until the job's next
  checkpointed window carries it out, and a second round would shrink more jobs than W needs.
- the explanation names W, its GPUs, the step undone and its S, and the S of the others.

The step down goes through the engine like any change: its measured throughputs are kept, so
once GPUs are idle and nobody waits for them it asks to step back up (the step passed before).
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from scheduler import elastic as engine
from scheduler.domain import Action, ActionKind, ClusterState, JobSpec, Plan, RunningJob
from scheduler.policies.base import PolicyError
from scheduler.policies.fifo import FifoPolicy

ELASTIC_DEFAULTS: dict[str, Any] = {
    "scaling_threshold": 0.1,
    "scale_step_workers": 0,
    "scale_interval_batches": 50,
    "straggler_threshold": 0.8,
    "straggler_ewma_alpha": 0.25,
    "gpu_cost_per_hour": 1.0,
    "lateness_value_per_hour": 100.0,
    "yield_to_queue": True,
}

GpuKey = tuple[str, int]


class ElasticPolicy(FifoPolicy):
    name: ClassVar[str] = "elastic"
    defaults: ClassVar[dict[str, Any]] = {**FifoPolicy.defaults, **ELASTIC_DEFAULTS}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        try:
            self.config = self._config(int(p["scale_step_workers"]) or 1)
        except (TypeError, ValueError) as exc:
            raise PolicyError(f"policy 'elastic': {exc}") from exc
        if not isinstance(p["yield_to_queue"], bool):
            raise PolicyError(
                f"policy 'elastic': yield_to_queue must be true or false, "
                f"got {p['yield_to_queue']!r}"
            )

    def _config(self, step: int) -> engine.ElasticConfig:
        p = self.params
        return engine.ElasticConfig(
            scaling_threshold=float(p["scaling_threshold"]),
            scale_step_workers=step,
            scale_interval_batches=int(p["scale_interval_batches"]),
            straggler_threshold=float(p["straggler_threshold"]),
            straggler_ewma_alpha=float(p["straggler_ewma_alpha"]),
            gpu_cost_per_hour=float(p["gpu_cost_per_hour"]),
            lateness_value_per_hour=float(p["lateness_value_per_hour"]),
        )

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        plan = super().schedule(state, rng)
        taken = {key for d in plan.decisions for key in d.placement.gpu_keys}
        actions = list(plan.actions)
        shrinks: dict[str, Action] = {}
        no_growth: dict[str, str] = {}  # GPU model -> the waiting job that keeps it
        if self.params["yield_to_queue"] and plan.waiting:
            shrinks, no_growth = self.yield_to_queue(state, plan, taken)
        for running in state.running:
            action = shrinks.get(running.job.id)
            if action is None:
                action = self.autoscale(running, state, taken, no_growth)
            if action is not None:
                actions.append(action)
        return Plan(decisions=plan.decisions, actions=tuple(actions), waiting=plan.waiting)

    def step_for(self, running: RunningJob, state: ClusterState) -> int:
        """K for this job: the parameter, or the GPU count of its first node."""
        k = int(self.params["scale_step_workers"])
        if k > 0:
            return k
        try:
            return max(1, len(state.node(running.placement.node).gpus))
        except KeyError:
            return 1

    def autoscale(
        self,
        running: RunningJob,
        state: ClusterState,
        taken: set[GpuKey],
        no_growth: dict[str, str] | None = None,
    ) -> Action | None:
        """The engine's move for one running job (None: nothing to do or nothing known).
        ``no_growth``: GPU models a queued job waits for (no step up onto them)."""
        job = engine.elastic_job_of(running.job)
        if job is None or running.elastic is None or running.paused:
            return None
        cfg = self._config(self.step_for(running, state))
        decision = engine.decide(running.elastic, job, cfg)
        if decision.kind == engine.DecisionKind.REPLACE:
            spares = self._idle_of_model(running, state, taken)
            if len(spares) < len(decision.ranks):
                return None  # no warmed spare can be had now; the straggler stays
            taken.update(spares[: len(decision.ranks)])
            return Action(
                ActionKind.REPLACE_WORKERS,
                running.job.id,
                self.name,
                decision.explanation,
                value=decision.ranks,
            )
        if decision.kind != engine.DecisionKind.SCALE:
            return None
        extra = decision.workers - running.elastic.workers
        if extra > 0 and no_growth and self._model_of(running, state) in no_growth:
            return None  # a queued job waits for GPUs of this model: do not take them
        if extra > 0:
            free = self._idle_of_model(running, state, taken)
            if len(free) < extra:
                return None  # no room to grow now; the job keeps its count
            taken.update(free[:extra])
        return Action(
            ActionKind.SET_WORKERS,
            running.job.id,
            self.name,
            decision.explanation,
            value={
                "workers_from": running.elastic.workers,
                "workers": decision.workers,
                "efficiency": decision.efficiency,
                "local_batch": decision.local_batch,
            },
        )

    @staticmethod
    def _model_of(running: RunningJob, state: ClusterState) -> str | None:
        """The GPU model of a running job (that of its first node's GPUs), None if unknown."""
        try:
            first = state.node(running.placement.node)
        except KeyError:
            return None
        for gpu in first.gpus:
            if gpu.index in running.placement.gpu_indices:
                return gpu.spec.model
        return None

    @classmethod
    def _idle_of_model(
        cls, running: RunningJob, state: ClusterState, taken: set[GpuKey]
    ) -> list[GpuKey]:
        """Idle GPUs of the job's model, its own nodes first, not placed this cycle."""
        model = cls._model_of(running, state)
        if model is None:
            return []
        own = set(running.placement.nodes)
        free = [
            (node.name, gpu.index)
            for node in state.nodes
            if node.up
            for gpu in node.gpus
            if gpu.idle and gpu.spec.model == model and (node.name, gpu.index) not in taken
        ]
        free.sort(key=lambda key: key[0] not in own)
        return free

    # -- yield to the queue ----------------------------------------------------------------

    def yield_to_queue(
        self, state: ClusterState, plan: Plan, taken: set[GpuKey]
    ) -> tuple[dict[str, Action], dict[str, str]]:
        """Steps down that let waiting jobs start (class docstring), and the GPU models no
        elastic job may step up onto this cycle (model -> the waiting job's id). Adds the
        GPUs each served job will take to ``taken``."""
        shrinks: dict[str, Action] = {}
        no_growth: dict[str, str] = {}
        holders = [h for r in state.running if (h := self._holder(r, state)) is not None]
        if not holders:
            return shrinks, no_growth
        cap = _Capacity(state, plan, taken)
        hopeless: set[tuple[object, ...]] = set()  # shapes that fit nowhere even at the minimum
        strict = not self.params.get("backfill", True)
        for job in state.pending:
            if job.id not in plan.waiting:
                continue
            allowed = self.allowed_models(job)
            for model in dict.fromkeys(h.model for h in holders):
                shape = (model, job.gpus, job.cpus, job.memory_need_mb(), allowed)
                if job.gpus < 1 or shape in hopeless or not cap.eligible(job, model, allowed):
                    continue
                if cap.fit(job, model, cap.idle(model)) is not None:
                    break  # it fits the idle GPUs: it waits for something else
                mine = [h for h in holders if h.model == model and h.running.job.id not in shrinks]
                at_min = cap.idle(model) + [k for h in mine for k in h.keys[h.floor :]]
                if cap.fit(job, model, at_min) is None:
                    # not even with every elastic job at its minimum (and capacity only
                    # shrinks during the cycle: the same shape will not fit later either)
                    hopeless.add(shape)
                    continue
                no_growth.setdefault(model, job.id)
                if any(h.unsettled for h in holders if h.model == model):
                    break  # a change that may be an earlier step down for it has not landed
                chosen = self._choose(job, model, cap, [h for h in mine if h.target is not None])
                if chosen is None:
                    break  # one step each is not enough this cycle
                pool = cap.idle(model) + [k for h in chosen for k in h.freed]
                keys = cap.fit(job, model, pool) or ()
                taken.update(keys)
                cap.reserve(model, keys, [k for h in chosen for k in h.freed])
                for h in chosen:
                    shrinks[h.running.job.id] = self._shrink_action(h, job, model, chosen, mine)
                break
            if strict:
                break  # with backfill off the jobs behind the first waiting one wait for it
        return shrinks, no_growth

    def _holder(self, running: RunningJob, state: ClusterState) -> _Holder | None:
        """An elastic job holding GPUs above its minimum (None: not elastic, not known)."""
        job = engine.elastic_job_of(running.job)
        model = self._model_of(running, state)
        if job is None or running.elastic is None or model is None or running.paused:
            return None
        keys = running.placement.gpu_keys
        if len(keys) <= job.min_workers:
            return None
        target = None
        s = None
        if not running.elastic.in_transition and running.elastic.workers == len(keys):
            target = engine.yield_target(running.elastic, job, self.step_for(running, state))
            if target is not None:
                s = engine.measured_step_efficiency(running.elastic, target, len(keys))
        return _Holder(running, job, model, keys, job.min_workers, target, s)

    @staticmethod
    def _choose(
        job: JobSpec, model: str, cap: _Capacity, steppable: list[_Holder]
    ) -> list[_Holder] | None:
        """The fewest steps down, lowest S first, after which ``job`` fits (None: none do)."""
        order = sorted(steppable, key=_Holder.rank)
        chosen: list[_Holder] = []
        pool = cap.idle(model)
        for h in order:
            chosen.append(h)
            pool = pool + h.freed
            if cap.fit(job, model, pool) is not None:
                break
        else:
            return None
        # drop steps the fit turned out not to need, the highest S first
        for h in reversed(list(chosen)):
            rest = [c for c in chosen if c is not h]
            if rest and cap.fit(job, model, cap.idle(model) + [k for c in rest for k in c.freed]):
                chosen = rest
        return chosen

    def _shrink_action(
        self,
        h: _Holder,
        waiting: JobSpec,
        model: str,
        chosen: list[_Holder],
        mine: list[_Holder],
    ) -> Action:
        w = len(h.keys)
        target = h.target if h.target is not None else w
        step = f"the step {target}->{w}"
        if h.s is None:
            worth = (
                f"S of {step} is not known yet ({w} not measured), and the steps with a known "
                f"S were not enough"
            )
        else:
            lowest = all(o.s is None or h.s <= o.s for o in mine if o.target is not None)
            worth = f"{step} had S={h.s:.2f}" + (
                f", the lowest of the elastic jobs on {model} that can step down"
                if lowest
                else f"; the jobs with a lower S free no GPUs {waiting.id} can use"
            )
        others = sorted((o for o in mine if o is not h and o.target is not None), key=_Holder.rank)
        if others:
            named = ", ".join(f"job {o.running.job.id}: {o.s_text()}" for o in others[:3])
            more = f" and {len(others) - 3} more" if len(others) > 3 else ""
            worth += f" ({named}{more})"
        also = [c for c in chosen if c is not h]
        if also:
            worth += "; also stepping down: " + ", ".join(
                f"job {c.running.job.id} {len(c.keys)} -> {c.target}" for c in also
            )
        batch = engine.local_batch_size(target, h.job.local_batch, h.job.max_global_batch)
        text = (
            f"yield to the queue: shrink {w} -> {target} workers so job {waiting.id} "
            f"({waiting.gpus} {model}) can start: {worth}; the engine keeps its measurements "
            f"and steps back up when GPUs are idle and no job waits for them"
            + (f"; local batch {batch}" if batch else "")
        )
        return Action(
            ActionKind.SET_WORKERS,
            h.running.job.id,
            self.name,
            text,
            value={
                "workers_from": w,
                "workers": target,
                "efficiency": h.s,
                "local_batch": batch,
                "yield_to": waiting.id,
            },
        )


class _Holder:
    """A running elastic job in the yield-to-the-queue search: ``keys`` its GPUs in rank order,
    ``target`` the count of one step down (None: it cannot step down now), ``s`` the measured S
    of the step it would undo (None: not measured)."""

    __slots__ = ("running", "job", "model", "keys", "floor", "target", "s")

    def __init__(
        self,
        running: RunningJob,
        job: engine.ElasticJob,
        model: str,
        keys: tuple[GpuKey, ...],
        floor: int,
        target: int | None,
        s: float | None,
    ) -> None:
        self.running, self.job, self.model, self.keys = running, job, model, keys
        self.floor, self.target, self.s = floor, target, s

    @property
    def unsettled(self) -> bool:
        """A change is under way whose direction is not known: the job holds no more GPUs than
        its workers, so it is not a step up warming new GPUs (the simulator holds those at
        once); on the live system a proposed step down looks like this until it is carried
        out at the job's next checkpointed window."""
        el = self.running.elastic
        return el is not None and el.in_transition and len(self.keys) <= el.workers

    @property
    def freed(self) -> list[GpuKey]:
        """The GPUs one step down frees: the last ranks'."""
        return [] if self.target is None else list(self.keys[self.target :])

    def rank(self) -> tuple[bool, float, int]:
        """Lowest measured S first, unmeasured last; then the larger job."""
        return (self.s is None, self.s if self.s is not None else 0.0, -len(self.keys))

    def s_text(self) -> str:
        w = len(self.keys)
        if self.s is None:
            return f"{self.target}->{w} S not known yet"
        return f"{self.target}->{w} S={self.s:.2f}"


class _Capacity:
    """Idle GPUs per model and free cores per node after this cycle's placements, and the
    fit test the yield uses (fifo's rules: ``gpus`` idle GPUs of one model on one node when a
    node of the model is that large, else a gang over several nodes; the job's cores on each)."""

    def __init__(self, state: ClusterState, plan: Plan, taken: set[GpuKey]) -> None:
        self.nodes = [n for n in state.nodes if n.up]
        self.cores = {n.name: n.free_cores for n in self.nodes}
        for d in plan.decisions:
            for part in d.placement.parts:
                if part.node in self.cores:
                    self.cores[part.node] -= part.cpus
        self._idle: dict[str, list[GpuKey]] = {}
        self.memory: dict[str, float] = {}
        self.size: dict[tuple[str, str], int] = {}  # (node, model) -> GPUs of the model
        for node in self.nodes:
            for gpu in node.gpus:
                model = gpu.spec.model
                self.memory[model] = max(self.memory.get(model, 0.0), gpu.spec.memory_mb)
                self.size[(node.name, model)] = self.size.get((node.name, model), 0) + 1
                if gpu.idle and gpu.key not in taken:
                    self._idle.setdefault(model, []).append(gpu.key)
        self.total_cores = {n.name: n.cores for n in self.nodes}
        self.order = {n.name: i for i, n in enumerate(self.nodes)}
        self._one_node: dict[tuple[str, int, int], bool] = {}

    def idle(self, model: str) -> list[GpuKey]:
        return list(self._idle.get(model, ()))

    def reserve(self, model: str, used: tuple[GpuKey, ...], freed: list[GpuKey]) -> None:
        """``used`` go to a served job; the rest of ``freed`` are idle for later ones."""
        pool = [k for k in self.idle(model) + freed if k not in set(used)]
        self._idle[model] = pool

    def eligible(self, job: JobSpec, model: str, allowed: frozenset[str] | None) -> bool:
        return (allowed is None or model in allowed) and self.memory.get(
            model, 0.0
        ) >= job.memory_need_mb()

    def _cores_ok(self, node: str, cpus: int) -> bool:
        return self.total_cores[node] <= 0 or self.cores[node] >= cpus

    def one_node(self, model: str, k: int, cpus: int) -> bool:
        """Whether some up node holds ``k`` GPUs of ``model`` (busy or not) and the cores: then
        fifo places the job on one node, never spread."""
        key = (model, k, cpus)
        if key not in self._one_node:
            self._one_node[key] = any(
                self.size.get((n.name, model), 0) >= k and (n.cores <= 0 or n.cores >= cpus)
                for n in self.nodes
            )
        return self._one_node[key]

    def fit(self, job: JobSpec, model: str, pool: list[GpuKey]) -> tuple[GpuKey, ...] | None:
        """The GPUs of ``pool`` (idle or freed) ``job`` would take on ``model`` (None: no fit).
        Costs O(pool): the pool is small when jobs wait."""
        k = job.gpus
        by_node: dict[str, list[GpuKey]] = {}
        for key in pool:
            if key[0] in self.order:
                by_node.setdefault(key[0], []).append(key)
        usable = sorted(
            (self.order[n], sorted(keys))
            for n, keys in by_node.items()
            if self._cores_ok(n, job.cpus)
        )
        if self.one_node(model, k, job.cpus):
            for _, keys in usable:  # the first node in cluster order, as fifo
                if len(keys) >= k:
                    return tuple(keys[:k])
            return None
        usable.sort(key=lambda nk: -len(nk[1]))  # a gang: the fewest nodes
        out: list[GpuKey] = []
        for _, keys in usable:
            out.extend(keys[: k - len(out)])
            if len(out) == k:
                return tuple(out)
        return None
