"""``exec_plan``: the GPU execution plan of seed 004 (ALGORITHMS.md §1, Algorithm 1).

A wrapper: the placements come from another registered policy (``placement``, default
``placement_rate``; the registry also offers ``<name>+exec_plan`` for any registered name), and
every interval the plan looks at each shared GPU's running jobs and predicts its memory from
their profiled memory steps:

- a running job that is growing (its current step, or the step it will reach within the
  look-ahead, peaks above what it uses now) counts with that step's peak plus ``alpha_mb``;
- a job that is not growing (no steps, or on a plateau) counts with what it uses now;
- a paused job counts with what it holds (a paused process keeps its memory and stops growing,
  like ``docker pause``).

If the prediction exceeds the GPU's memory, the growing job with the lowest priority is paused,
then the next, until the prediction fits. Otherwise paused jobs are resumed, highest priority
first, as long as the prediction with their next step still fits. A paused job that is alone on
its GPU (with nothing running there) is resumed anyway: nothing will free memory for it.

**Reading chosen** (the paper is terse; also in docs/seed004.md):

- Algorithm 1 adds a task's step requirement only "if step_i >= Pmem_i"; we read it as above
  (growing jobs at their step's peak, the others at their current use) and pause only growing
  jobs, since pausing a job that does not grow frees nothing.
- Priority is the placement rate of eq. (2) computed over the jobs on that GPU
  (``priority_features``, default: ``placement_rate``'s features); ties: the job started last
  has the lower priority. In the paper's run this pauses LAMMPS (rate below CNN's).
- Look-ahead: a job's progress per second is estimated as progress / time since it started,
  at least an equal share of its GPU (1 / (solo time x unpaused jobs there)), and for a paused
  job at least 1 / its solo time; the step it will be in ``lookahead_intervals`` intervals
  from now counts, so it is paused before it crosses into a step that does not fit.
- A paused job is judged by its next step (the one it was about to grow into) however far the
  look-ahead reaches: "the prediction with their next step" of Algorithm 1's UNPAUSE. Without
  this a job faster than its profile says (a scaled demo job) was resumed while that step
  still did not fit, and paused again seconds later.
- New placements from the wrapped policy on a GPU are held back while the GPU's prediction,
  with every paused job there at its resumed need, plus the new job's first step would exceed
  the GPU's memory: paused jobs get the room first (otherwise new arrivals can starve them).

Only single GPUs not in MIG mode are planned (a MIG instance isolates memory).

Parameters:

- ``placement`` (str, "placement_rate"): the registered policy that places jobs.
- ``placement_params`` (mapping or None): its parameters; any parameter that is not one of the
  plan's own is passed to it as well.
- ``interval_s`` (float, 5.0): how often the plan runs (the simulator calls the policy every
  ``tick_interval_s``; the live loop calls it every cycle). 5 s is the monitoring period of the
  003 setup's NVML monitor.
- ``alpha_mb`` (float, 128.0): the safety margin ``alpha`` added to a growing job's step.
- ``lookahead_intervals`` (float, 2.0): see above.
- ``priority_features`` (mapping feature -> weight or None): see above.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from scheduler.domain import (
    Action,
    ActionKind,
    ClusterState,
    Decision,
    GpuState,
    JobSpec,
    Plan,
    RunningJob,
    SharingMode,
)
from scheduler.policies.base import Policy, PolicyError
from scheduler.policies.framework import gb
from scheduler.policies.memory_steps import Step, job_steps, memory_at, step_at
from scheduler.policies.placement_rate import (
    DEFAULT_FEATURES,
    check_features,
    job_times,
    placement_rates,
)
from scheduler.policies.registry import build_policy

_TOL_MB = 1e-3

exec_plan_defaults: dict[str, Any] = {
    "placement": "placement_rate",
    "placement_params": None,
    "interval_s": 5.0,
    "alpha_mb": 128.0,
    "lookahead_intervals": 2.0,
    "priority_features": None,
}


@dataclass(frozen=True, slots=True)
class MemoryNeed:
    """One job's memory on a GPU as the plan sees it."""

    job: JobSpec
    used_mb: float  # what it holds now
    need_mb: float  # what it will need while running (step peak + alpha if growing)
    step: Step | None  # the step that sets ``need_mb`` (None: no steps)
    growing: bool


def job_need(
    job: JobSpec,
    progress: float,
    *,
    rate_per_s: float,
    horizon_s: float,
    alpha_mb: float,
    through_next_step: bool = False,
) -> MemoryNeed:
    """Current use and predicted need of ``job`` at ``progress`` (see the module docstring).
    ``through_next_step``: the prediction reaches at least the step after the current one,
    whatever the horizon (for a paused job: see ``need_of``)."""
    steps = job_steps(job)
    used = memory_at(job, progress, steps)
    if not steps:
        return MemoryNeed(job, used, used, None, False)
    now_step = step_at(steps, progress)
    target = min(1.0, progress + max(0.0, rate_per_s) * horizon_s)
    if through_next_step and now_step is not None and now_step.end < 1.0:
        target = max(target, now_step.end)
    later = step_at(steps, target)
    step = now_step
    if later is not None and now_step is not None and later.peak_mb > now_step.peak_mb:
        step = later
    peak = step.peak_mb if step is not None and progress < 1.0 else used
    if peak > used + _TOL_MB:
        return MemoryNeed(job, used, peak + alpha_mb, step, True)
    return MemoryNeed(job, used, used, step, False)


class ExecPlanPolicy(Policy):
    name: ClassVar[str] = "exec_plan"
    defaults: ClassVar[Mapping[str, Any]] = exec_plan_defaults

    def __init__(self, **params: Any) -> None:
        # Parameters that are not the plan's own go to the wrapped policy (which checks them),
        # so ``build_policy("placement_rate+exec_plan", {"max_jobs_per_gpu": 5})`` works.
        own = {k: v for k, v in params.items() if k in self.defaults}
        passed = {k: v for k, v in params.items() if k not in self.defaults}
        super().__init__(**own)
        p = self.params
        inner_name = p["placement"]
        if not isinstance(inner_name, str) or inner_name.endswith("exec_plan"):
            raise PolicyError(
                f"policy {self.name!r}: placement must name a placement policy, got {inner_name!r}"
            )
        inner_params = {**dict(p.get("placement_params") or {}), **passed}
        self.inner = build_policy(inner_name, inner_params)
        try:
            self.interval_s = float(p["interval_s"])
            self.alpha_mb = float(p["alpha_mb"])
            self.lookahead = float(p["lookahead_intervals"])
        except (TypeError, ValueError) as exc:
            raise PolicyError(
                f"policy {self.name!r}: interval_s, alpha_mb and "
                "lookahead_intervals must be numbers"
            ) from exc
        if self.interval_s <= 0 or self.alpha_mb < 0 or self.lookahead < 0:
            raise PolicyError(
                f"policy {self.name!r}: interval_s must be > 0, alpha_mb and "
                "lookahead_intervals >= 0"
            )
        self.priority_features = check_features(
            self.name, p.get("priority_features") or DEFAULT_FEATURES
        )
        # The simulator calls the policy this often (engine: ``tick_interval_s``).
        self.tick_interval_s = self.interval_s
        # The ticks watch memory: the simulator skips them while no running job has steps.
        self.tick_watches_memory = True

    # -- the cycle -----------------------------------------------------------------------------

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        inner = self.inner.schedule(state, rng)
        if not inner.decisions and not any(r.paused or _has_steps(r.job) for r in state.running):
            # No placement to check and no job that grows or waits to resume: nothing to plan
            # (the common tick on a cluster of jobs without memory steps).
            return Plan(actions=inner.actions, waiting=inner.waiting)
        actions: list[Action] = list(inner.actions)
        gpus = {g.key: g for n in state.nodes for g in n.gpus}
        groups: dict[tuple[str, int], list[RunningJob]] = {}
        for r in state.running:
            for key in r.placement.gpu_keys:  # every node of a gang
                groups.setdefault(key, []).append(r)
        reserved: dict[tuple[str, int], float] = {}
        for key in sorted(groups):
            gpu = gpus.get(key)
            if gpu is None or gpu.mode == SharingMode.MIG:
                continue
            acts, reserved[key] = self.plan_gpu(state, gpu, groups[key])
            actions.extend(acts)
        decisions, waiting = self.admit(state, gpus, inner.decisions, reserved, inner.waiting)
        return Plan(decisions=tuple(decisions), actions=tuple(actions), waiting=waiting)

    def need_of(
        self, state: ClusterState, r: RunningJob, model: str, sharing: int = 1
    ) -> MemoryNeed:
        """``r``'s memory need; ``sharing`` = unpaused jobs on its GPU (for the speed floor)."""
        elapsed = state.now_s - r.started_s
        solo = r.job.solo_time_s(model)
        rate = r.progress / elapsed if r.progress > 0 and elapsed > 0 else 0.0
        if solo:
            # The measured rate lags after a pause (the time since it started includes the
            # pause), so it is floored at an equal share of the GPU, and a paused job is judged
            # at solo speed: it must not be resumed just before the step that made it pause.
            floor = 1.0 / solo if r.paused else 1.0 / (solo * max(1, sharing))
            rate = max(rate, floor)
        # A paused job was paused for a step it was about to grow into, and resumed it grows
        # into it: judge it by that step (its next one), not by how far it would get within
        # the look-ahead. Otherwise a job whose speed the profile underrates (a scaled demo,
        # a faster GPU) is resumed while its next step still does not fit, and paused again.
        return job_need(
            r.job,
            r.progress,
            rate_per_s=rate,
            horizon_s=self.lookahead * self.interval_s,
            alpha_mb=self.alpha_mb,
            through_next_step=r.paused,
        )

    def priorities(self, group: Sequence[RunningJob], model: str) -> dict[str, float]:
        jobs = [r.job for r in group]
        times = [job_times(j, frozenset({model}), True) for j in jobs]
        rates = placement_rates(jobs, times, self.priority_features)
        return {j.id: rate for j, rate in zip(jobs, rates, strict=True)}

    def plan_gpu(
        self, state: ClusterState, gpu: GpuState, group: Sequence[RunningJob]
    ) -> tuple[list[Action], float]:
        """Pause / resume actions for one GPU, and its predicted memory with every paused job
        at its resumed need (what new placements must leave room for)."""
        if not any(r.paused or _has_steps(r.job) for r in group):
            # Nothing grows and nothing waits to resume: no action is possible, and every
            # job's need is its constant memory (the same answer as the full plan, cheaply:
            # the simulator calls this every interval for every GPU).
            return [], sum(r.job.memory_need_mb() for r in group)
        cap = float(gpu.spec.memory_mb)
        label = f"{gpu.node}/gpu{gpu.index}"
        now = state.now_s
        sharing = sum(1 for r in group if not r.paused)
        needs = {r.job.id: self.need_of(state, r, gpu.spec.model, sharing) for r in group}
        prio = self.priorities(group, gpu.spec.model)
        started = {r.job.id: r.started_s for r in group}

        def low_first(job_id: str) -> tuple[float, float, str]:
            return (prio[job_id], -started[job_id], job_id)

        paused = {r.job.id for r in group if r.paused}
        total = sum(needs[j].used_mb if j in paused else needs[j].need_mb for j in needs)
        actions: list[Action] = []
        if total > cap + _TOL_MB:
            growing = sorted(
                (j for j in needs if j not in paused and needs[j].growing), key=low_first
            )
            for job_id in growing:
                if total <= cap + _TOL_MB:
                    break
                m = needs[job_id]
                actions.append(
                    Action(
                        ActionKind.PAUSE,
                        job_id,
                        self.name,
                        f"paused {now - started[job_id]:.0f} s after its start: "
                        f"{self.step_text(m)} needs {gb(m.need_mb)} GB, "
                        f"{gb(total)} of {gb(cap)} GB predicted on {label}; lowest priority among "
                        f"the growing jobs of the {len(group)} there (rate {prio[job_id]:.3f})",
                    )
                )
                total -= m.need_mb - m.used_mb
                paused.add(job_id)
        else:
            running = [j for j in needs if j not in paused]
            for job_id in sorted(paused, key=low_first, reverse=True):
                m = needs[job_id]
                after = total - m.used_mb + m.need_mb
                if after <= cap + _TOL_MB:
                    why = f"{gb(after)} of {gb(cap)} GB predicted on {label}"
                elif not running:
                    why = (
                        f"alone on {label}, so it runs although {gb(after)} GB exceeds {gb(cap)} GB"
                    )
                else:
                    continue
                actions.append(
                    Action(
                        ActionKind.RESUME,
                        job_id,
                        self.name,
                        f"resumed {now - started[job_id]:.0f} s after its start: "
                        f"{self.step_text(m)} needs {gb(m.need_mb)} GB, "
                        f"{why}",
                    )
                )
                total = after
                paused.discard(job_id)
                running.append(job_id)
        reserved = sum(
            needs[j].need_mb
            if j in paused
            else (needs[j].need_mb if needs[j].growing else needs[j].used_mb)
            for j in needs
        )
        return actions, reserved

    def admit(
        self,
        state: ClusterState,
        gpus: Mapping[tuple[str, int], GpuState],
        decisions: Sequence[Decision],
        reserved: dict[tuple[str, int], float],
        waiting: Mapping[str, str],
    ) -> tuple[list[Decision], dict[str, str]]:
        """Keep the wrapped policy's placements that leave room for the predicted memory."""
        out: list[Decision] = []
        held = dict(waiting)
        for d in decisions:
            pl = d.placement
            keys = list(pl.gpu_keys)
            job = next((j for j in state.pending if j.id == pl.job_id), None)
            if pl.mode == SharingMode.MIG or not keys or job is None:
                out.append(replace(d, policy=self.name))
                continue
            m = job_need(job, 0.0, rate_per_s=0.0, horizon_s=0.0, alpha_mb=self.alpha_mb)
            blocked = None
            for key in keys:
                gpu = gpus.get(key)
                if gpu is None:
                    continue
                if reserved.get(key, 0.0) + m.need_mb > gpu.spec.memory_mb + _TOL_MB:
                    blocked = (key, gpu)
                    break
            if blocked is None:
                for key in keys:
                    reserved[key] = reserved.get(key, 0.0) + m.need_mb
                out.append(replace(d, policy=self.name))
                continue
            key, gpu = blocked
            held[pl.job_id] = (
                f"held back by {self.name}: {gb(reserved.get(key, 0.0))} GB predicted on "
                f"{key[0]}/gpu{key[1]} (paused jobs at their next step included) + "
                f"{gb(m.need_mb)} GB would exceed {gb(gpu.spec.memory_mb)} GB"
            )
        return out, held

    @staticmethod
    def step_text(m: MemoryNeed) -> str:
        name = m.job.name or (m.job.profile.name if m.job.profile else "") or "job"
        if m.step is None:
            return name
        return f"{name} step {m.step.number}"


def _has_steps(job: JobSpec) -> bool:
    return job.profile is not None and bool(job.profile.memory_steps)


def exec_plan_over(placement: str) -> type[ExecPlanPolicy]:
    """The class registered as ``<placement>+exec_plan``."""
    return type(
        f"ExecPlanOver_{placement}",
        (ExecPlanPolicy,),
        {
            "name": f"{placement}+exec_plan",
            "defaults": {**exec_plan_defaults, "placement": placement},
            "__module__": __name__,
        },
    )


class PlacementRateExecPlan(ExecPlanPolicy):
    """``placement_rate+exec_plan``: the paper's full scheme (placement and execution plan)."""

    name: ClassVar[str] = "placement_rate+exec_plan"
    defaults: ClassVar[Mapping[str, Any]] = {**exec_plan_defaults, "placement": "placement_rate"}


class AllGpuExecPlan(ExecPlanPolicy):
    """``all_gpu+exec_plan``: everything on GPU, with the execution plan."""

    name: ClassVar[str] = "all_gpu+exec_plan"
    defaults: ClassVar[Mapping[str, Any]] = {**exec_plan_defaults, "placement": "all_gpu"}
