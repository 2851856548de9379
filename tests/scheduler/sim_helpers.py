"""Tiny policies and builders for the simulator tests (independent of the real baselines)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from scheduler.cluster_spec import parse_cluster_spec
from scheduler.domain import (
    Action,
    ClusterState,
    Decision,
    JobSpec,
    MemoryStep,
    Placement,
    Plan,
    Profile,
    SharingMode,
)
from scheduler.policies.base import Policy


def cluster(*groups: dict, gpu_models: dict | None = None):
    data = {"nodes": list(groups)}
    if gpu_models:
        data["gpu_models"] = gpu_models
    return parse_cluster_spec(data)


def job(
    job_id: str,
    solo: float,
    *,
    model: str = "V100",
    arrival: float = 0.0,
    gpus: int = 1,
    mem: float | None = None,
    steps: Sequence[tuple[float, float, float]] = (),
    cpu_time: float | None = None,
    job_type: str | None = None,
) -> JobSpec:
    """A job whose solo time on ``model`` is ``solo`` seconds."""
    profile = Profile(
        name=f"p-{job_id}",
        gpu_time_s={model: solo},
        cpu_time_s=cpu_time,
        gpu_memory_max_mb=mem,
        memory_steps=tuple(MemoryStep(*s) for s in steps),
    )
    return JobSpec(id=job_id, arrival_s=arrival, gpus=gpus, profile=profile, job_type=job_type)


class FirstFit(Policy):
    """Queue order; each job on the first GPU(s) of one node that can take it under ``mode``
    (at most ``per_gpu`` jobs per GPU; memory by the monitored use); MIG uses ``mig_profile``.
    ``check`` (optional) is called with every snapshot, for invariant checks."""

    name = "test-firstfit"

    def __init__(
        self,
        mode: SharingMode = SharingMode.EXCLUSIVE,
        per_gpu: int = 1,
        mig_profile: str | None = None,
        check: Callable[[ClusterState], None] | None = None,
    ) -> None:
        super().__init__()
        self.mode, self.per_gpu, self.mig_profile, self.check = mode, per_gpu, mig_profile, check
        self.calls: list[float] = []

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        self.calls.append(state.now_s)
        if self.check is not None:
            self.check(state)
        taken: dict[tuple[str, int], int] = {}
        used_mem: dict[tuple[str, int], float] = {}
        decisions = []
        for j in state.pending:
            pl = self._place(j, state, taken, used_mem)
            if pl is not None:
                decisions.append(Decision(pl, self.name, "first fit"))
        return Plan(decisions=tuple(decisions))

    def _place(self, j, state, taken, used_mem) -> Placement | None:
        for node in state.nodes:
            ok = []
            for g in node.gpus:
                if j.solo_time_s(g.spec.model) is None:
                    continue
                n = len(g.job_ids) + taken.get(g.key, 0)
                mem = (g.used_memory_mb or 0.0) + used_mem.get(g.key, 0.0)
                if n >= self.per_gpu or (n and g.mode not in (None, self.mode)):
                    continue
                if self.mode != SharingMode.MIG and mem + j.memory_need_mb() > g.spec.memory_mb:
                    continue
                ok.append(g)
                if len(ok) == j.gpus:
                    for x in ok:
                        taken[x.key] = taken.get(x.key, 0) + 1
                        used_mem[x.key] = used_mem.get(x.key, 0.0) + j.memory_need_mb()
                    return Placement(
                        j.id,
                        node.name,
                        tuple(x.index for x in ok),
                        self.mode,
                        mig_profile=self.mig_profile,
                    )
        return None


class Scripted(Policy):
    """Calls ``fn(state, rng) -> Plan`` (lets a test script decisions and actions)."""

    name = "test-scripted"

    def __init__(self, fn: Callable[[ClusterState, random.Random], Plan]) -> None:
        super().__init__()
        self.fn = fn

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        return self.fn(state, rng)


class RandomShare(Policy):
    """Places each pending single-GPU job on a random GPU with fewer than ``per_gpu`` jobs and
    enough free memory (by monitored use), under the GPU's sharing mode (MPS if supported,
    else time-slicing); waits otherwise. For determinism and invariant tests."""

    name = "test-random"

    def __init__(self, per_gpu: int = 3, check: Callable[[ClusterState], None] | None = None):
        super().__init__()
        self.per_gpu, self.check = per_gpu, check

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        if self.check is not None:
            self.check(state)
        extra: dict[tuple[str, int], list[float]] = {}
        decisions, waiting = [], {}
        for j in state.pending:
            options = []
            for node in state.nodes:
                for g in node.gpus:
                    add = extra.get(g.key, [])
                    mem = (g.used_memory_mb or 0.0) + sum(add)
                    if (
                        len(g.job_ids) + len(add) < self.per_gpu
                        and mem + j.memory_need_mb() <= g.spec.memory_mb
                    ):
                        options.append((node.name, g))
            if not options:
                waiting[j.id] = "no GPU with room"
                continue
            node_name, g = rng.choice(options)
            mode = g.mode or (
                SharingMode.MPS if g.spec.supports(SharingMode.MPS) else SharingMode.TIME_SLICING
            )
            extra.setdefault(g.key, []).append(j.memory_need_mb())
            decisions.append(
                Decision(
                    Placement(j.id, node_name, (g.index,), mode),
                    self.name,
                    f"random among {len(options)}",
                )
            )
        return Plan(decisions=tuple(decisions), waiting=waiting)


class FixedSlowdown:
    """An interference model: ``value`` for MPS next to anyone (else 1.0)."""

    name = "fixed"

    def __init__(self, value: float) -> None:
        self.value = value

    def slowdown(self, job, co_runners, gpu, mode) -> float:
        return self.value if co_runners and mode == SharingMode.MPS else 1.0


def pause(job_id: str) -> Action:
    from scheduler.domain import ActionKind

    return Action(ActionKind.PAUSE, job_id, "test", "pause")


def resume(job_id: str) -> Action:
    from scheduler.domain import ActionKind

    return Action(ActionKind.RESUME, job_id, "test", "resume")
