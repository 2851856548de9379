"""``elastic``: fifo placement plus the autoscaling engine of seed 002 (ALGORITHMS.md §6).

Pending jobs are placed as ``fifo`` places them (exclusive GPUs, first fit), starting with the
worker count they ask (``gpus``). For every running job that declares a worker range
(``elastic_min``/``elastic_max``) and whose snapshot carries its autoscaling memory
(``RunningJob.elastic``: throughputs measured every 10 mini-batches, straggler averages), the
engine in ``scheduler.elastic`` decides, with a reason quoting the measured scaling efficiency S:

- ``REPLACE_WORKERS`` (value: the ranks) for persistent stragglers: throughput / median < 0.8
  on an EWMA, replaced by a warmed-up spare (only proposed when an idle GPU of the job's model
  is left after this cycle's placements);
- ``SET_WORKERS`` (value: ``{"workers_from", "workers", "efficiency", "local_batch"}``) to
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
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from scheduler import elastic as engine
from scheduler.domain import Action, ActionKind, ClusterState, Plan, RunningJob
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
}


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
        for running in state.running:
            action = self.autoscale(running, state, taken)
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
        self, running: RunningJob, state: ClusterState, taken: set[tuple[str, int]]
    ) -> Action | None:
        """The engine's move for one running job (None: nothing to do or nothing known)."""
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
    def _idle_of_model(
        running: RunningJob, state: ClusterState, taken: set[tuple[str, int]]
    ) -> list[tuple[str, int]]:
        """Idle GPUs of the job's model, its own nodes first, not placed this cycle."""
        model = None
        try:
            first = state.node(running.placement.node)
            for gpu in first.gpus:
                if gpu.index in running.placement.gpu_indices:
                    model = gpu.spec.model
        except KeyError:
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
