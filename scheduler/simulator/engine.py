"""The discrete-event simulator: a trace replayed on a simulated cluster under one policy.

This module holds the event loop (``Simulator.run``), the events (arrivals, completions,
memory-step boundaries, OOM checks, ticks), the policy call and the application of its plan.
Beside it: ``state`` (the records of jobs, GPUs and nodes), ``base`` (the shared state,
primitives and the policy's snapshots), ``elastic_jobs`` (elastic data-parallel jobs),
``speeds`` (the sharing and interference model as applied, and memory forecasts),
``validation`` (checking a decision) and ``recording`` (timeline, samples, job records).

Execution model (docs/simulator.md has the long version):

- Work. A job's progress runs from 0 to 1 (fraction of its solo work). On a GPU of model g its
  speed is ``1 / solo_time(g)`` per second times a factor <= 1 for sharing; on a CPU placement
  ``1 / cpu_time_s``. Progress is integrated lazily between events; when co-location, pause
  state or placement changes, the speeds of the jobs involved are recomputed and their next
  event (completion, or the next memory-step boundary) is rescheduled. No fixed ticks.
- Sharing factor per GPU: EXCLUSIVE 1; TIME_SLICING ``1 / (n * (1 + overhead) * part)`` with
  ``n`` unpaused jobs (n > 1) and ``part`` the interference model's time-slicing part; MPS
  ``1 / slowdown`` from the interference model next to the unpaused co-runners; MIG
  ``(slices / total) ** mig_speed_exponent``. A multi-GPU job runs at its slowest GPU's speed.
  Slowdowns below 1 are clamped to 1 (no co-runner makes a job faster than alone); an infinite
  slowdown ("cannot co-run", measured infeasible for memory) is an OOM of the job placed last.
- Memory. A job's GPU memory follows ``Profile.memory_steps`` (linear within a step from
  ``from_mb`` to ``to_mb`` as progress goes from the step's start to the next step's start),
  else its constant ``memory_need_mb()``. Paused jobs keep their memory. When the jobs on a GPU
  (or one MIG instance) outgrow it, the growing job is OOM-killed: failed or requeued.
- The policy is called after each batch of simultaneous events that includes an arrival, a
  completion, a failure, or a periodic tick, with a ``ClusterState`` snapshot. Its plan is
  validated (``PolicyDecisionError``) and applied: actions first, then decisions. Ticks come
  every ``SimConfig.reschedule_interval_s``, else every ``policy.tick_interval_s`` if the
  policy has that attribute (execution plans that watch running jobs). Applied PAUSE / RESUME
  actions are logged in ``Simulator.action_log`` and appended to the job's explanation.
- Elastic data-parallel jobs (a worker range and a measured curve for their job type:
  ``scheduler.simulator.elastic``) run at the curve's throughput for their worker count, local
  batch and consolidation, times their slowest rank's speed; every ``window_steps`` reference
  steps they produce a statistics window folded into ``RunningJob.elastic`` while the engine
  is measuring (none once it converged, until a rank turns straggler). ``SET_WORKERS`` grows
  them onto idle GPUs of their model (warm-up, then a regroup pause) or shrinks them;
  ``REPLACE_WORKERS`` warms a spare that then takes the straggler's place. An action that
  cannot be applied is skipped and logged in ``SimResult.elastic_events``. When a step down
  freed GPUs while jobs wait, the policy is called again at the same instant (the live
  system's next cycle), so the queue sees them at once.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from scheduler.admission import admit
from scheduler.catalog import MigLayoutError
from scheduler.cluster_spec import ClusterSpec
from scheduler.domain import Action, ActionKind, ClusterState, JobSpec, Placement, Plan, SharingMode
from scheduler.interference import InterferenceModel
from scheduler.knowledge import Knowledge, Observation, ObservationKind
from scheduler.policies.base import Policy
from scheduler.simulator.base import (
    EVENT_ARRIVAL,
    EVENT_DP_READY,
    EVENT_DP_TIMER,
    EVENT_JOB,
    EVENT_OOM,
    EVENT_READY,
    EVENT_SAMPLE,
    EVENT_TICK,
)
from scheduler.simulator.elastic_jobs import ElasticJobs
from scheduler.simulator.recording import add_timeline_point, job_record, slowdown_sample
from scheduler.simulator.results import (
    EndReason,
    OomAction,
    PolicyDecisionError,
    SimConfig,
    SimResult,
    SimulationError,
    TimelinePoint,
)
from scheduler.simulator.speeds import (
    gpu_factor,
    gpu_util,
    mig_slices,
    oom_check_at,
    oom_victims,
)
from scheduler.simulator.state import DONE, PENDING, RUNNING, SimGpu, SimJob
from scheduler.simulator.validation import check_decision


class Simulator(ElasticJobs):
    """Replays ``jobs`` on ``cluster`` under ``policy``. Call ``run()`` once.

    ``interference``: an ``InterferenceModel`` (``scheduler.interference``) or None for no
    interference. ``on_job_end(done, total)`` is called whenever a job ends (progress bars).

    ``true_work``: job id -> true / declared work (the truth behind noisy estimates,
    ``scheduler.estimates``; missing: 1). ``SimConfig.estimate_noise`` > 0 draws it here
    instead (seeded by ``SimConfig.seed``). It stays in the engine: policies see only the
    profiles and the ``knowledge`` (``scheduler.knowledge.Knowledge``; None: a new one with
    the pair prior of ``SimConfig.pair_noise``, unless ``SimConfig.learn`` is False), which
    the engine feeds what a live cluster would observe (progress windows, completions).
    The constructor and the shared state are ``scheduler.simulator.base.SimulatorBase``'s.
    """

    # ------------------------------------------------------------------------------------
    # Main loop

    def run(self) -> SimResult:
        """Run to the end and return the records. Raises PolicyDecisionError on a bad plan."""
        wall0 = time.perf_counter()
        for job in self.jobs:
            self._push(job.spec.arrival_s, EVENT_ARRIVAL, job)
        # A policy that must look at running jobs periodically (an execution plan) asks for
        # ticks with a ``tick_interval_s`` attribute; the config's interval wins if set.
        rounds_s = self.config.round_s
        interval = (
            rounds_s
            or self.config.reschedule_interval_s
            or getattr(self.policy, "tick_interval_s", None)
        )
        # A policy whose ticks only watch memory (an execution plan: ``tick_watches_memory``)
        # gets them only while a running job has memory steps; the tick chain stops otherwise
        # and restarts when such a job is placed (a 5-s plan over a 76-day trace of jobs
        # without steps would be millions of idle calls).
        self.memory_ticks = (
            not rounds_s
            and not self.config.reschedule_interval_s
            and bool(getattr(self.policy, "tick_watches_memory", False))
        )
        self.tick_every = interval
        if rounds_s:
            self._push(0.0, EVENT_TICK, None)  # decisions only at round boundaries (Gavel)
        elif interval and not self.memory_ticks:
            self._push(interval, EVENT_TICK, None)
        self.sample_interval = self.config.sample_interval_s or self._auto_sample_interval()
        self._push(0.0, EVENT_SAMPLE, None)
        horizon = self.config.max_time_s
        stopped_early = False
        while self.heap:
            t = self.heap[0][0]
            if horizon is not None and t > horizon:
                self._advance_clock(horizon)
                stopped_early = True
                break
            self._advance_clock(t)
            trigger = False
            sample = False
            round_now = False
            while self.heap and self.heap[0][0] <= t:
                _, kind, _, obj, version = heapq.heappop(self.heap)
                self.events += 1
                if kind == EVENT_JOB:
                    trigger |= self._on_job_event(obj, version)
                elif kind == EVENT_OOM:
                    if obj.version == version:
                        trigger |= self._check_oom(obj)
                elif kind == EVENT_ARRIVAL:
                    self._on_arrival(obj)
                    trigger = True
                elif kind == EVENT_TICK:
                    if self.memory_ticks:
                        self.tick_armed = False
                        if not self.live_nodes:
                            continue  # nothing grows: the chain stops until a step job starts
                    trigger = True
                    round_now = True
                    if self._alive():
                        self._push(t + interval, EVENT_TICK, None)
                        self.tick_armed = True
                elif kind == EVENT_READY:
                    if obj.status == RUNNING and obj.ready_at <= t:  # its MIG instance is up
                        self.touched_jobs.add(obj)
                        if obj.dp is not None:
                            self._dp_watch(obj)
                elif kind == EVENT_DP_TIMER:
                    trigger |= self._on_dp_timer(obj, version)
                elif kind == EVENT_DP_READY:
                    self._on_dp_ready(obj, version)
                else:
                    sample = True
            rounds = 0
            while True:
                if rounds_s and not round_now:
                    trigger = False  # between rounds nothing is decided; arrivals wait
                if trigger:
                    self._call_policy()
                    round_now = False
                trigger = self._recompute()
                if self.freed_for_queue:
                    # the next cycle of the live system: the queue sees the freed GPUs now
                    self.freed_for_queue = False
                    trigger = trigger or bool(self.pending)
                if not trigger:
                    break
                rounds += 1
                if rounds > 10_000:  # pragma: no cover - a policy that never settles
                    raise SimulationError(
                        f"policy {self.policy_name!r} does not settle at t={t:.3f} s"
                    )
            self._record_timeline()
            if sample:
                self._sample_slowdown()
                ticking = interval and (not self.memory_ticks or self.tick_armed)
                if self._active() or (ticking and self._alive()):
                    self._push(t + self.sample_interval, EVENT_SAMPLE, None)
        return self._finish(stopped_early, time.perf_counter() - wall0)

    def _active(self) -> bool:
        """Whether a job still arrives or makes progress."""
        now = self.now
        return bool(self.arrivals_left) or any(
            j.rate > 0.0 or j.ready_at > now for j in self.running.values()
        )

    def _alive(self) -> bool:
        """Whether anything can still happen (else ticks and samples stop)."""
        if self._active():
            self.idle_calls = 0
            return True
        # Nothing runs and nothing arrives: keep calling the policy (it may resume a paused
        # job or place a waiting one) until it has changed nothing max_idle_ticks times.
        return self.idle_calls < self.config.max_idle_ticks

    def _auto_sample_interval(self) -> float:
        if not self.jobs:
            return 1.0
        work = 0.0
        longest = 0.0
        for j in self.jobs:
            times = [] if j.spec.profile is None else list(j.spec.profile.gpu_time_s.values())
            cpu = j.spec.profile.cpu_time_s if j.spec.profile is not None else None
            if cpu is not None and (j.spec.gpus == 0 or not times):
                times.append(cpu)
            if times:
                fastest = min(times)
                work += fastest * max(1, j.spec.gpus)
                longest = max(longest, fastest)
        span = max(j.spec.arrival_s for j in self.jobs) + longest
        span += work / max(1, self.gpu_count)
        return max(span / 400.0, 1e-3)

    # ------------------------------------------------------------------------------------
    # Events

    def _on_arrival(self, job: SimJob) -> None:
        self.arrivals_left -= 1
        verdict = admit(job.spec, self.capacity)
        if not verdict.ok:
            # It could never run here: rejected now rather than blocking the queue for ever.
            job.explanation = f"rejected at arrival: {verdict.reason()}"
            self._end_job(job, EndReason.REJECTED)
            return
        job.t_last = self.now
        self.pending[job.spec.id] = job
        self.pending_specs[job.spec.id] = job.spec
        self.pending_tuple = None

    def _on_job_event(self, job: SimJob, version: int) -> bool:
        if job.version != version or job.status != RUNNING:
            return False
        self._advance(job)
        if job.target < 1.0:
            # A memory-step boundary: snap onto it; the memory slope of its GPUs changes.
            job.progress = max(job.progress, job.target)
            self.touched_jobs.add(job)
            self.touched_gpus.update(job.gpus)
            return False
        job.progress = 1.0
        self._end_job(job, EndReason.COMPLETED)
        return True

    def _check_oom(self, gpu: SimGpu) -> bool:
        """OOM-kill the job that grew if the jobs on ``gpu`` outgrew it. True if one died."""
        victims = self._oom_victims(gpu)
        for victim in victims:
            beside = [j for j in gpu.jobs if j is not victim]
            self._oom(victim, f"out of memory on {gpu.label()}", beside)
        if not victims:
            self.touched_gpus.add(gpu)  # re-forecast
        return bool(victims)

    def _oom_victims(self, gpu: SimGpu) -> list[SimJob]:
        return oom_victims(gpu, self.now)

    def _oom(self, job: SimJob, why: str, beside: Sequence[SimJob] = ()) -> None:
        """``job`` is killed (out of memory, or a pair that cannot co-run) next to ``beside``:
        requeued or failed (``SimConfig.oom_action``). A requeued job carries the types it died
        beside (``JobSpec.oom_with``: an observation the live system could make too)."""
        self.oom_count += 1
        job.oom_count += 1
        if (
            self.config.oom_action == OomAction.REQUEUE
            and job.restarts < self.config.max_oom_restarts
        ):
            seen = frozenset(b.spec.type_key() for b in beside)
            if not seen <= job.spec.oom_with:
                job.spec = replace(job.spec, oom_with=job.spec.oom_with | seen)
            job.restarts += 1
            self._to_queue(job, keep_progress=False)
            job.explanation = f"{why}; requeued (restart {job.restarts})"
        else:
            self._end_job(job, EndReason.FAILED_OOM)
            job.explanation = f"{why}; failed"

    # ------------------------------------------------------------------------------------
    # Job state changes
    def _release(self, job: SimJob) -> None:
        """Take a running job off its GPUs and cores."""
        self._advance(job)
        self._observe_window(job, reopen=False)
        job.run_s += self.now - job.last_start
        self._charge(job)
        job.dp = None
        for gpu in job.gpus:
            gpu.jobs.remove(job)
            if job.placement is not None and job.placement.mig_profile:
                gpu.mig_used -= mig_slices(gpu, job.placement.mig_profile)
                self.mig.release((gpu.node.name, gpu.index), job.spec.id)
            if not gpu.jobs:
                gpu.mode = None
            self.touched_gpus.add(gpu)
        if job.placement is not None:
            for node, part in zip(job.nodes, job.placement.parts, strict=True):
                node.free_cores += part.cpus
                self.dirty_nodes.add(node)
        if job.paused:
            job.paused_total += self.now - job.paused_since
            job.paused = False
            self.n_paused -= 1
        if job.segments and job.gpus:
            for node in job.nodes:
                self._count_live(node, -1)
        job.nodes = []
        job.gpus = []
        job.rate = 0.0
        job.version += 1
        self.running.pop(job.spec.id, None)
        self.rj.pop(job.spec.id, None)
        self.rj_dirty.discard(job)
        self.running_tuple = None

    def _end_job(self, job: SimJob, reason: EndReason) -> None:
        if job.status == RUNNING:
            self._release(job)
        elif job.status == PENDING:
            self.pending.pop(job.spec.id, None)
            self.pending_specs.pop(job.spec.id, None)
            self.pending_tuple = None
        job.status = DONE
        job.reason = reason
        job.finish = self.now
        self.done += 1
        if reason == EndReason.COMPLETED and self.knowledge is not None and job.run_s > 0:
            self.knowledge.observe(
                Observation(
                    kind=ObservationKind.COMPLETED,
                    job_id=job.spec.id,
                    job_type=job.spec.type_key(),
                    at_s=self.now,
                    window_s=job.run_s,
                    gpu_model=job.model,
                    gpus=job.spec.gpus,
                    progress_from=0.0,
                    progress_to=1.0,
                    owner=job.spec.owner,
                )
            )
        if self.on_job_end is not None:
            self.on_job_end(self.done, len(self.jobs))

    def _to_queue(self, job: SimJob, *, keep_progress: bool) -> None:
        self._release(job)
        job.status = PENDING
        if not keep_progress:
            job.progress = 0.0
        self.pending[job.spec.id] = job
        if len(self.pending) > 1:  # keep submission order
            self.pending = dict(sorted(self.pending.items(), key=lambda kv: kv[1].seq))
        self.pending_specs = {k: j.spec for k, j in self.pending.items()}
        self.pending_tuple = None

    # ------------------------------------------------------------------------------------
    # Speeds, next events and memory forecasts

    def _recompute(self) -> bool:
        """Recompute speeds after changes; returns True if an infeasible co-location killed a
        job (the policy is then called again)."""
        if not self.touched_gpus and not self.touched_jobs:
            return False
        touched_jobs, touched_gpus = self.touched_jobs, self.touched_gpus
        # Changes made while recomputing (an OOM kill) are collected for the next round.
        self.touched_jobs, self.touched_gpus = set(), set()
        affected = set(touched_jobs)
        for gpu in touched_gpus:
            affected.update(gpu.jobs)
        forecast = set(touched_gpus)
        killed = False
        for job in sorted(affected, key=lambda j: j.seq):
            if job.status != RUNNING:
                continue
            self._advance(job)
            new_rate, blocked = self._rate(job)
            if blocked is not None:
                victim = max(blocked.jobs, key=lambda j: (j.last_start, j.seq))
                self._oom(
                    victim,
                    f"cannot co-run on {blocked.label()} (interference model: infeasible)",
                    [j for j in blocked.jobs if j is not victim],
                )
                killed = True
                continue
            if self.knowledge is not None:
                ctx = self._obs_context(job)
                if ctx != job.obs_ctx or new_rate != job.rate:
                    self._observe_window(job, reopen=False)
                    self._open_window(job, ctx, new_rate)
            if new_rate != job.rate or job in touched_jobs:
                job.rate = new_rate
                job.version += 1
                self._schedule_job(job)
                forecast.update(job.gpus)
                self.rj_dirty.add(job)
                self.dirty_nodes.update(job.nodes)
        for gpu in sorted(forecast, key=lambda g: (g.node.spec_index, g.index)):
            gpu.version += 1
            self.dirty_nodes.add(gpu.node)
            old = gpu.util
            gpu.util = gpu_util(gpu)
            self.busy += gpu.util - old
            self._forecast_oom(gpu)
        return killed

    def _rate(self, job: SimJob) -> tuple[float, SimGpu | None]:
        """(progress per second, GPU whose co-location is infeasible or None)."""
        if job.paused or job.ready_at > self.now:
            return 0.0, None
        if job.dp is not None:
            base = job.dp.rate() / job.dp.total if job.dp.total > 0 else math.inf
        else:
            base = 1.0 / job.solo_s if job.solo_s > 0 else math.inf
        factor = 1.0
        for gpu in job.gpus:
            f = self._gpu_factor(job, gpu)
            if f == 0.0:
                return 0.0, gpu
            factor = min(factor, f)
        return base * factor, None

    def _gpu_factor(self, job: SimJob, gpu: SimGpu) -> float:
        return gpu_factor(job, gpu, self.interference, self.config)

    def _schedule_job(self, job: SimJob) -> None:
        if job.rate <= 0.0:
            return
        t_end = self.now + (1.0 - job.progress) / job.rate
        bound = job.next_bound(job.progress)
        if bound is not None and bound < 1.0:
            t_bound = self.now + (bound - job.progress) / job.rate
            if t_bound < t_end:
                job.target = bound
                self._push(t_bound, EVENT_JOB, job, job.version)
                return
        job.target = 1.0
        self._push(t_end, EVENT_JOB, job, job.version)

    def _forecast_oom(self, gpu: SimGpu) -> None:
        """Push an OOM check for when the jobs on ``gpu`` will outgrow it at current speeds."""
        at = oom_check_at(gpu, self.now)
        if at is not None:
            self._push(at, EVENT_OOM, gpu, gpu.version)

    # ------------------------------------------------------------------------------------
    # Observations: what a live cluster would see (scheduler.knowledge)

    def _declared(self, job: SimJob) -> float:
        """Progress as the job reports it: done / declared work (capped at 1)."""
        return min(1.0, job.progress_at(self.now) * job.work_factor)

    def _obs_context(self, job: SimJob) -> tuple | None:
        """(model, mode, co-runner types, spread, GPUs) of a running, progressing job."""
        if job.status != RUNNING or job.paused or job.dp is not None or not job.gpus:
            return None
        pl = job.placement
        mode = pl.mode if pl is not None else SharingMode.EXCLUSIVE
        co = sorted(
            {o.spec.type_key() for g in job.gpus for o in g.jobs if o is not job and not o.paused}
            if mode != SharingMode.MIG
            else ()
        )
        spread = len(job.nodes) > 1
        return (job.model, mode, tuple(co), spread, len(job.gpus))

    def _open_window(self, job: SimJob, ctx: tuple | None, rate: float) -> None:
        """Start measuring a new window of ``job`` (its context or speed changed); while it
        progresses, it is due for its first report at the next sweep."""
        now = self.now
        job.obs_t, job.obs_p, job.obs_ctx = now, self._declared(job), ctx
        job.obs_since = now
        job.obs_gen += 1
        if ctx is not None and rate > 0.0 and job.spec.length_known:
            heapq.heappush(self.obs_due, (now, job.seq, job.obs_gen, job))

    def _observe_window(self, job: SimJob, *, reopen: bool) -> None:
        """Hand the window since ``job.obs_t`` to the knowledge (if it progressed), as the
        progress reports the job made at the sweeps since then plus the one it makes now
        (``_reports``)."""
        knowledge = self.knowledge
        if knowledge is None:
            return
        ctx = job.obs_ctx
        now = self.now
        # (A job that declared no length reports no progress fraction a cluster could see.)
        if (
            ctx is not None
            and now > job.obs_t
            and job.ready_at <= job.obs_t
            and job.spec.length_known
        ):
            p = self._declared(job)
            window = now - job.obs_t
            if p >= 1.0 and job.rate > 0:
                # It reported all its declared work before the window ended: measure up to then.
                window = min(window, (1.0 - job.obs_p) / (job.rate * job.work_factor))
            if p > job.obs_p + 1e-12 and window > 0:
                model, mode, co, spread, gpus = ctx
                knowledge.observe(
                    Observation(
                        kind=ObservationKind.PROGRESS,
                        job_id=job.spec.id,
                        job_type=job.spec.type_key(),
                        at_s=job.obs_t + window,
                        window_s=window,
                        gpu_model=model,
                        gpus=gpus,
                        mode=mode,
                        co_runners=co,
                        progress_from=job.obs_p,
                        progress_to=p,
                        owner=job.spec.owner,
                        spread=spread,
                    ),
                    reports=self._reports(job.obs_t, job.obs_t + window),
                )
        if reopen:
            job.obs_t, job.obs_p = now, self._declared(job)
        else:
            job.obs_ctx = None
            job.obs_gen += 1

    def _reports(self, start: float, end: float) -> int:
        """Progress reports a job makes over a constant-speed window from ``start`` to ``end``
        (where its declared progress stopped moving, if before now): one at every sweep
        inside it and one at its end."""
        sweeps = self.sweep_times
        return 1 + bisect.bisect_left(sweeps, end) - bisect.bisect_right(sweeps, start)

    def _sweep_observations(self) -> None:
        """The live progress reports: every ``SimConfig.observe_every_s`` seconds (at the first
        policy call after) every running job reports its progress since its last report.

        A window whose job keeps its speed and co-location adds the same rate at every
        report, so it is handed to the knowledge folded: at the first sweep after it opened,
        then only when its age doubled (or ``observe_every_s`` passed), and when it closes,
        each time with the sum of the reports folded in (``Knowledge.observe``'s
        ``reports``). The knowledge gets the same windows' progress, seconds and count, each
        rate as soon as the first report, and the sweep costs the windows due, not every
        running job."""
        if self.knowledge is None or self.now - self.last_sweep < self.config.observe_every_s:
            return
        now = self.now
        self.last_sweep = now
        due = self.obs_due
        every = self.config.observe_every_s
        later: list[tuple[float, int, int, SimJob]] = []
        while due and due[0][0] <= now:
            _, seq, gen, job = heapq.heappop(due)
            if job.obs_gen != gen or job.obs_ctx is None or job.rate <= 0.0:
                continue  # closed since, or not progressing (a new window opens when it does)
            if now <= job.obs_t:
                later.append((now + every, seq, gen, job))
                continue
            self._observe_window(job, reopen=True)
            later.append((now + max(every, now - job.obs_since), seq, gen, job))
        for entry in later:
            heapq.heappush(due, entry)
        self.sweep_times.append(now)

    def _call_policy(self) -> None:
        self._sweep_observations()
        state = ClusterState(
            now_s=self.now,
            nodes=self._nodes_snapshot(),
            pending=self._pending_snapshot(),
            running=self._running_snapshot(),
            knowledge=self.knowledge,
            attained_s=self.attained,
        )
        t0 = time.perf_counter()
        plan = self.policy.schedule(state, self.rng)
        self.latencies.append(time.perf_counter() - t0)
        self.policy_calls += 1
        if not isinstance(plan, Plan):
            raise SimulationError(
                f"policy {self.policy_name!r} returned {type(plan).__name__}, not a Plan"
            )
        changed = False
        self.reserved = {key for d in plan.decisions for key in d.placement.gpu_keys}
        for action in plan.actions:
            changed |= self._apply_action(action)
        self.reserved = set()
        for decision in plan.decisions:
            self._apply_decision(decision.placement, decision.explanation)
            changed = True
        self.last_waiting = plan.waiting
        self.idle_calls = 0 if changed else self.idle_calls + 1

    def _apply_action(self, action: Action) -> bool:
        job = self.by_id.get(action.job_id)
        if job is None:
            raise PolicyDecisionError(
                self.policy_name, action.job_id, f"{action.kind} names an unknown job"
            )
        kind = action.kind
        if (
            kind in (ActionKind.PAUSE, ActionKind.RESUME, ActionKind.REQUEUE)
            and job.status != RUNNING
        ):
            raise PolicyDecisionError(
                self.policy_name, job.spec.id, f"{kind} on a job that is {job.status}, not running"
            )
        if kind == ActionKind.PAUSE:
            if job.paused:
                return False
            self._advance(job)
            job.paused = True
            job.paused_since = self.now
            self.n_paused += 1
        elif kind == ActionKind.RESUME:
            if not job.paused:
                return False
            self._advance(job)
            job.paused = False
            job.paused_total += self.now - job.paused_since
            self.n_paused -= 1
        elif kind == ActionKind.REQUEUE:
            job.preemptions += 1
            self._to_queue(job, keep_progress=self.config.requeue_keeps_progress)
            job.restart_cost = self.config.preemption_cost(job.spec.job_type)
            job.explanation = f"requeued by {self.policy_name}: {action.explanation}"
            return True
        elif kind in (ActionKind.SET_WORKERS, ActionKind.REPLACE_WORKERS):
            return self._apply_elastic(job, action)
        else:
            self.ignored_actions += 1  # data ratios: not modelled
            return False
        self.touched_jobs.add(job)
        self.touched_gpus.update(job.gpus)
        self.rj_dirty.add(job)
        self.action_log.append((self.now, str(kind), job.spec.id, action.explanation))
        if action.explanation:
            job.explanation = f"{job.explanation}; {action.explanation}"
        return True

    # ------------------------------------------------------------------------------------
    # Decisions

    def _apply_decision(self, pl: Placement, explanation: str) -> None:
        """Validate ``pl`` (every part of a gang: node, cores, GPU indices, one GPU model,
        mode and memory on every GPU) and start the job; PolicyDecisionError if impossible."""
        name = self.policy_name
        job = self.by_id.get(pl.job_id)
        if job is None:
            raise PolicyDecisionError(name, pl.job_id, "placed a job that does not exist")
        nodes, gpus, model, solo, ref = check_decision(
            name,
            job,
            pl,
            queued=pl.job_id in self.pending,
            node_by_name=self.node_by_name,
            now=self.now,
            unconsolidated_speed=self.config.unconsolidated_speed,
        )
        parts = pl.parts
        # Apply.
        self._advance(job)
        self.pending.pop(pl.job_id)
        self.pending_specs.pop(pl.job_id)
        self.pending_tuple = None
        job.status = RUNNING
        job.placement = pl
        job.nodes = nodes
        job.gpus = gpus
        job.model = model
        job.solo_s = float(solo) * job.work_factor
        job.ref_s = float(ref) * job.work_factor
        job.paused = False
        if job.first_start is None:
            job.first_start = self.now
        job.last_start = self.now
        job.held_since = self.now
        job.explanation = explanation
        if model is not None and gpus:
            job.dp = self._curve_job(job, model, pl)
            if job.dp is not None:
                job.solo_s = job.ref_s = job.dp.solo_s(pl.gpu_count)
                job.ready_at = max(job.ready_at, self.now + self.elastic_model.warmup_s)
                self._push(job.ready_at, EVENT_READY, job)
        if job.restart_cost > 0:  # checkpoint restore after a preemption: no progress yet
            job.ready_at = max(job.ready_at, self.now + job.restart_cost)
            job.restart_cost = 0.0
            self._push(job.ready_at, EVENT_READY, job)
        for node, part in zip(nodes, parts, strict=True):
            node.free_cores -= part.cpus
            self.dirty_nodes.add(node)
            if job.segments and gpus:
                self._count_live(node, +1)
        for gpu in gpus:
            gpu.jobs.append(job)
            gpu.mode = pl.mode
            if pl.mode == SharingMode.MIG:
                gpu.mig_used += mig_slices(gpu, pl.mig_profile)
                self._mig_place(job, gpu, pl)
            self.touched_gpus.add(gpu)
        self.touched_jobs.add(job)
        self.running[pl.job_id] = job
        self.rj_dirty.add(job)
        self.running_tuple = None

    def _mig_place(self, job: SimJob, gpu: SimGpu, pl: Placement) -> None:
        """Sharing hook: the job takes a MIG instance; creating one delays its start."""
        try:
            delay = self.mig.place((gpu.node.name, gpu.index), gpu.spec, job.spec.id, pl)
        except MigLayoutError as exc:
            raise PolicyDecisionError(self.policy_name, pl.job_id, str(exc)) from exc
        if delay > 0:
            job.ready_at = max(job.ready_at, self.now + delay)
            self._push(job.ready_at, EVENT_READY, job)

    # ------------------------------------------------------------------------------------
    # Recording (scheduler.simulator.recording)

    def _record_timeline(self) -> None:
        paused = self.n_paused
        point = TimelinePoint(
            self.now, self.busy, len(self.pending), len(self.running) - paused, paused
        )
        add_timeline_point(self.timeline, point)

    def _sample_slowdown(self) -> None:
        sample = slowdown_sample(self.running.values(), self.now)
        if sample is not None:
            self.samples.append(sample)

    def _finish(self, stopped_early: bool, wall_s: float) -> SimResult:
        for job in self.jobs:
            if job.status == DONE:
                continue
            if job.status == RUNNING:
                self._release(job)
                job.reason = EndReason.UNFINISHED
            elif stopped_early or job.spec.arrival_s > self.now:
                job.reason = EndReason.UNFINISHED
            else:
                job.reason = EndReason.UNSCHEDULABLE
                job.waiting = self.last_waiting.get(job.spec.id, "")
                if job.waiting:
                    job.explanation = job.waiting
            job.status = DONE
        self._record_timeline()
        records = [job_record(j) for j in self.jobs]
        return SimResult(
            policy=self.policy_name,
            gpu_count=self.gpu_count,
            jobs=records,
            timeline=self.timeline,
            slowdown_samples=self.samples,
            decision_latency_s=self.latencies,
            oom_count=self.oom_count,
            events=self.events,
            policy_calls=self.policy_calls,
            wall_s=wall_s,
            ignored_actions=self.ignored_actions,
            config=self.config,
            gpu_seconds={j.spec.id: j.gpu_s for j in self.jobs},
            elastic_events=self.elastic_events,
        )


def simulate(
    cluster: ClusterSpec,
    jobs: Sequence[JobSpec],
    policy: Policy,
    *,
    interference: InterferenceModel | None = None,
    config: SimConfig | None = None,
    on_job_end: Callable[[int, int], None] | None = None,
    true_work: Mapping[str, float] | None = None,
    knowledge: Knowledge | None = None,
) -> SimResult:
    """Replay ``jobs`` on ``cluster`` under ``policy``; see ``Simulator``."""
    return Simulator(
        cluster,
        jobs,
        policy,
        interference=interference,
        config=config,
        on_job_end=on_job_end,
        true_work=true_work,
        knowledge=knowledge,
    ).run()
