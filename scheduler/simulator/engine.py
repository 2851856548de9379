"""The discrete-event simulator: a trace replayed on a simulated cluster under one policy.

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
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from itertools import count

from scheduler import elastic as en
from scheduler.admission import admit, capacity_of
from scheduler.catalog import MigLayoutError
from scheduler.cluster_spec import ClusterSpec
from scheduler.domain import (
    Action,
    ActionKind,
    ClusterState,
    GpuSpec,
    GpuState,
    JobSpec,
    NodeKind,
    NodeState,
    Placement,
    PlacementPart,
    Plan,
    RunningJob,
    SharingMode,
)
from scheduler.interference import InterferenceModel
from scheduler.knowledge import Knowledge, Observation, ObservationKind
from scheduler.knowledge.priors import truth_pair_prior
from scheduler.policies.base import Policy
from scheduler.simulator.elastic import (
    CurveTable,
    DataParallelJob,
    ElasticModel,
    Transition,
    load_curve_table,
)
from scheduler.simulator.results import (
    ElasticEvent,
    EndReason,
    JobRecord,
    OomAction,
    PolicyDecisionError,
    SimConfig,
    SimResult,
    SimulationError,
    SlowdownSample,
    TimelinePoint,
)
from scheduler.simulator.sharing import MigBook

# Event kinds; the number orders simultaneous events (completions free memory before the OOM
# checks, and both before arrivals and ticks).
_JOB, _OOM, _ARRIVAL, _TICK, _SAMPLE, _READY, _DP_TIMER, _DP_READY = 0, 1, 2, 3, 4, 5, 6, 7
_MEM_TOL_MB = 1e-3  # memory may exceed capacity by this much (float noise) before an OOM

_PENDING, _RUNNING, _DONE = "pending", "running", "done"


class _Job:
    __slots__ = (
        "spec",
        "seq",
        "status",
        "placement",
        "gpus",
        "nodes",
        "model",
        "solo_s",
        "ref_s",
        "progress",
        "t_last",
        "rate",
        "paused",
        "version",
        "first_start",
        "last_start",
        "finish",
        "reason",
        "explanation",
        "segments",
        "bounds",
        "const_mem",
        "oom_count",
        "restarts",
        "preemptions",
        "paused_since",
        "paused_total",
        "rj_version",
        "waiting",
        "target",
        "ready_at",
        "restart_cost",
        "work_factor",
        "dp",
        "gpu_s",
        "held_since",
        "obs_t",
        "obs_p",
        "obs_ctx",
        "run_s",
    )

    def __init__(self, spec: JobSpec, seq: int, work_factor: float = 1.0) -> None:
        self.spec = spec
        self.seq = seq
        self.status = _PENDING
        self.placement: Placement | None = None
        self.gpus: list[_Gpu] = []
        self.nodes: list[_Node] = []  # node rank order (one unless a gang)
        self.model: str | None = None
        self.solo_s = 0.0  # solo time of its placement: spread over nodes for a gang
        self.ref_s = 0.0  # solo time on one node of its model (Slow-Down's reference)
        self.progress = 0.0
        self.t_last = 0.0
        self.rate = 0.0
        self.paused = False
        self.version = 0
        self.first_start: float | None = None
        self.last_start = 0.0
        self.finish: float | None = None
        self.reason: EndReason | None = None
        self.explanation = ""
        self.waiting = ""
        self.oom_count = 0
        self.restarts = 0
        self.preemptions = 0
        self.paused_since = 0.0
        self.paused_total = 0.0
        self.rj_version = 0
        self.target = 1.0  # progress at its next scheduled event (a step boundary or 1)
        self.ready_at = 0.0  # no progress before this time (a MIG instance being created)
        self.restart_cost = 0.0  # seconds without progress at its next start (preempted)
        self.dp: DataParallelJob | None = None  # an elastic job on a measured curve
        self.gpu_s = 0.0  # GPU-seconds held so far
        self.held_since = 0.0
        # True work / estimated work (noisy estimates: scheduler.estimates). Engine-private:
        # the profile holds the estimate the policy reads; the simulator runs the true work.
        self.work_factor = work_factor
        # The observation window being measured (what a live cluster would see): since obs_t,
        # from declared progress obs_p, under obs_ctx (model, mode, co-runner types, spread,
        # GPUs); None while not running.
        self.obs_t = 0.0
        self.obs_p = 0.0
        self.obs_ctx: tuple | None = None
        self.run_s = 0.0  # seconds placed, every attempt
        # Memory phases as segments (start, end, from_mb, to_mb); bounds = starts.
        steps = spec.profile.memory_steps if spec.profile is not None else ()
        self.const_mem = spec.memory_need_mb()
        self.segments: list[tuple[float, float, float, float]] = []
        for i, s in enumerate(steps):
            end = steps[i + 1].start_fraction if i + 1 < len(steps) else 1.0
            if end > s.start_fraction:
                self.segments.append((s.start_fraction, end, s.from_mb, s.to_mb))
        if self.segments and self.segments[0][0] > 0:
            first = self.segments[0]
            self.segments.insert(0, (0.0, first[0], first[2], first[2]))
        self.bounds = [seg[0] for seg in self.segments]

    # Memory as a function of progress -----------------------------------------------------

    def mem_at(self, p: float) -> float:
        """GPU memory (MB, per GPU) at progress ``p``."""
        if not self.segments:
            return self.const_mem
        i = max(0, bisect.bisect_right(self.bounds, p) - 1)
        start, end, lo, hi = self.segments[i]
        frac = min(1.0, max(0.0, (p - start) / (end - start)))
        return lo + (hi - lo) * frac

    def mem_slope(self, p: float) -> float:
        """d memory / d progress (MB per unit progress) in the segment holding ``p``."""
        if not self.segments or p >= 1.0:
            return 0.0
        i = max(0, bisect.bisect_right(self.bounds, p) - 1)
        start, end, lo, hi = self.segments[i]
        return (hi - lo) / (end - start)

    def next_bound(self, p: float) -> float | None:
        i = bisect.bisect_right(self.bounds, p + 1e-12)
        return self.bounds[i] if i < len(self.bounds) else None

    @property
    def mig_profile(self) -> str | None:
        """The MIG instance profile of its placement (None: not placed, or not under MIG)."""
        return self.placement.mig_profile if self.placement is not None else None

    def progress_at(self, now: float) -> float:
        if self.rate <= 0.0:
            return self.progress
        return min(1.0, self.progress + self.rate * (now - self.t_last))


class _Gpu:
    __slots__ = ("node", "index", "spec", "mode", "jobs", "mig_used", "version", "util")

    def __init__(self, node: _Node, index: int, spec: GpuSpec) -> None:
        self.node = node
        self.index = index
        self.spec = spec
        self.mode: SharingMode | None = None
        self.jobs: list[_Job] = []
        self.mig_used = 0
        self.version = 0
        self.util = 0.0

    @property
    def live(self) -> bool:
        """True if its memory use changes with time (a job on it has memory steps)."""
        return any(j.segments for j in self.jobs)

    def label(self) -> str:
        return f"{self.node.name}/{self.index}"


class _Node:
    __slots__ = ("spec_index", "name", "kind", "cores", "free_cores", "memory_mb", "gpus")

    def __init__(self, spec_index: int, name: str, kind: NodeKind, cores: int, memory: float):
        self.spec_index = spec_index
        self.name = name
        self.kind = kind
        self.cores = cores
        self.free_cores = cores
        self.memory_mb = memory
        self.gpus: list[_Gpu] = []


class Simulator:
    """Replays ``jobs`` on ``cluster`` under ``policy``. Call ``run()`` once.

    ``interference``: an ``InterferenceModel`` (``scheduler.interference``) or None for no
    interference. ``on_job_end(done, total)`` is called whenever a job ends (progress bars).

    ``true_work``: job id -> true / declared work (the truth behind noisy estimates,
    ``scheduler.estimates``; missing: 1). ``SimConfig.estimate_noise`` > 0 draws it here
    instead (seeded by ``SimConfig.seed``). It stays in the engine: policies see only the
    profiles and the ``knowledge`` (``scheduler.knowledge.Knowledge``; None: a new one with
    the pair prior of ``SimConfig.pair_noise``, unless ``SimConfig.learn`` is False), which
    the engine feeds what a live cluster would observe (progress windows, completions).
    """

    def __init__(
        self,
        cluster: ClusterSpec,
        jobs: Sequence[JobSpec],
        policy: Policy,
        *,
        interference: InterferenceModel | None = None,
        config: SimConfig | None = None,
        on_job_end: Callable[[int, int], None] | None = None,
        true_work: Mapping[str, float] | None = None,
        knowledge: Knowledge | None = None,
    ) -> None:
        self.cluster = cluster
        self.policy = policy
        self.policy_name = policy.name or type(policy).__name__
        self.interference = interference
        self.config = config or SimConfig()
        self.on_job_end = on_job_end
        self.rng = random.Random(self.config.seed)
        ids = [j.id for j in jobs]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise SimulationError(f"job id {dup!r} appears twice in the trace")
        truth = dict(true_work or {})
        if self.config.estimate_noise > 0:
            from scheduler.estimates import with_noisy_estimates

            jobs, drawn = with_noisy_estimates(jobs, self.config.estimate_noise, self.config.seed)
            for k, v in drawn.items():
                truth[k] = truth.get(k, 1.0) * v
        self.jobs = [_Job(spec, i, truth.get(spec.id, 1.0)) for i, spec in enumerate(jobs)]
        if knowledge is None and self.config.learn:
            knowledge = Knowledge(
                prior_sigma=max(self.config.estimate_noise, 0.05),
                pair_prior_sigma=max(self.config.pair_noise, 0.05),
                pair_prior=truth_pair_prior(
                    interference,
                    cluster,
                    noise=self.config.pair_noise,
                    seed=self.config.seed,
                    context_switch_overhead=self.config.context_switch_overhead,
                ),
            )
        self.knowledge = knowledge
        self.last_sweep = 0.0
        self.by_id = {j.spec.id: j for j in self.jobs}
        self.nodes: list[_Node] = []
        self.node_by_name: dict[str, _Node] = {}
        for i, ns in enumerate(cluster.nodes):
            node = _Node(i, ns.name, ns.kind, ns.cores, ns.memory_mb)
            if ns.gpu_model is not None:
                spec = cluster.gpu_spec(ns.gpu_model)
                node.gpus = [_Gpu(node, k, spec) for k in range(ns.gpu_count)]
            self.nodes.append(node)
            self.node_by_name[node.name] = node
        self.gpu_count = sum(len(n.gpus) for n in self.nodes)
        # MIG instances per GPU (sharing hook: scheduler.simulator.sharing.MigBook).
        self.mig = MigBook(self.config.mig_relayout_s)
        # What the cluster could ever give one job (scheduler.admission): jobs asking more
        # are rejected at their arrival.
        self.capacity = capacity_of(cluster.initial_nodes())

        self.now = 0.0
        self.heap: list[tuple] = []
        self.seq = count()
        self.pending: dict[str, _Job] = {}  # queue order
        self.pending_specs: dict[str, JobSpec] = {}  # the same, as specs (cheap snapshots)
        self.last_waiting: Mapping[str, str] = {}  # the last plan's reasons for waiting jobs
        self.running: dict[str, _Job] = {}
        self.arrivals_left = len(self.jobs)
        self.done = 0
        self.oom_count = 0
        self.events = 0
        self.policy_calls = 0
        self.ignored_actions = 0
        # Applied PAUSE / RESUME actions: (time, kind, job id, explanation).
        self.action_log: list[tuple[float, str, str, str]] = []
        self.elastic_model = self.config.elastic_model or ElasticModel()
        self.curve_table: CurveTable | None = None
        self.elastic_events: list[ElasticEvent] = []
        self._step_k: dict[tuple[str, str], int] = {}  # the policy's K per (job, first node)
        self.reserved: set[tuple[str, int]] = set()  # GPUs the plan being applied places on
        # An applied step down freed GPUs: with jobs waiting, the policy is called again at once.
        self.freed_for_queue = False
        self.latencies: list[float] = []
        self.timeline: list[TimelinePoint] = []
        self.samples: list[SlowdownSample] = []
        self.busy = 0.0
        self.busy_area = 0.0  # GPU-seconds busy so far
        self.n_paused = 0
        self.live_nodes: dict[_Node, int] = {}  # nodes running jobs with memory steps
        self.memory_ticks = False  # run(): the policy's ticks only watch memory
        self.tick_every: float | None = None
        self.tick_armed = False
        self.idle_calls = 0  # consecutive policy calls that changed nothing
        # Changes since the last recompute.
        self.touched_gpus: set[_Gpu] = set()
        self.touched_jobs: set[_Job] = set()
        # Snapshot caches.
        self.node_states: list[NodeState] = [self._node_state(n) for n in self.nodes]
        self.dirty_nodes: set[_Node] = set()
        self.nodes_tuple: tuple[NodeState, ...] | None = None
        self.pending_tuple: tuple[JobSpec, ...] | None = None
        self.rj: dict[str, RunningJob] = {}
        self.rj_dirty: set[_Job] = set()
        self.rj_refresh: list[tuple[float, int, int, _Job]] = []
        self.running_tuple: tuple[RunningJob, ...] | None = None

    # ------------------------------------------------------------------------------------
    # Main loop

    def run(self) -> SimResult:
        """Run to the end and return the records. Raises PolicyDecisionError on a bad plan."""
        wall0 = time.perf_counter()
        for job in self.jobs:
            self._push(job.spec.arrival_s, _ARRIVAL, job)
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
            self._push(0.0, _TICK, None)  # decisions only at round boundaries (Gavel)
        elif interval and not self.memory_ticks:
            self._push(interval, _TICK, None)
        self.sample_interval = self.config.sample_interval_s or self._auto_sample_interval()
        self._push(0.0, _SAMPLE, None)
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
                if kind == _JOB:
                    trigger |= self._on_job_event(obj, version)
                elif kind == _OOM:
                    if obj.version == version:
                        trigger |= self._check_oom(obj)
                elif kind == _ARRIVAL:
                    self._on_arrival(obj)
                    trigger = True
                elif kind == _TICK:
                    if self.memory_ticks:
                        self.tick_armed = False
                        if not self.live_nodes:
                            continue  # nothing grows: the chain stops until a step job starts
                    trigger = True
                    round_now = True
                    if self._alive():
                        self._push(t + interval, _TICK, None)
                        self.tick_armed = True
                elif kind == _READY:
                    if obj.status == _RUNNING and obj.ready_at <= t:  # its MIG instance is up
                        self.touched_jobs.add(obj)
                        if obj.dp is not None:
                            self._dp_watch(obj)
                elif kind == _DP_TIMER:
                    trigger |= self._on_dp_timer(obj, version)
                elif kind == _DP_READY:
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
                    self._push(t + self.sample_interval, _SAMPLE, None)
        return self._finish(stopped_early, time.perf_counter() - wall0)

    def _push(self, t: float, kind: int, obj: object, version: int = 0) -> None:
        heapq.heappush(self.heap, (t, kind, next(self.seq), obj, version))

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

    def _advance_clock(self, t: float) -> None:
        self.busy_area += self.busy * (t - self.now)
        self.now = t

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

    def _on_arrival(self, job: _Job) -> None:
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

    def _on_job_event(self, job: _Job, version: int) -> bool:
        if job.version != version or job.status != _RUNNING:
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

    def _check_oom(self, gpu: _Gpu) -> bool:
        """OOM-kill the job that grew if the jobs on ``gpu`` outgrew it. True if one died."""
        victims = self._oom_victims(gpu)
        for victim in victims:
            beside = [j for j in gpu.jobs if j is not victim]
            self._oom(victim, f"out of memory on {gpu.label()}", beside)
        if not victims:
            self.touched_gpus.add(gpu)  # re-forecast
        return bool(victims)

    def _oom_victims(self, gpu: _Gpu) -> list[_Job]:
        now = self.now
        if gpu.mode == SharingMode.MIG:
            out = []
            for j in gpu.jobs:
                cap = self._mig_memory(gpu, j)
                if j.mem_at(j.progress_at(now)) > cap + _MEM_TOL_MB / 2:
                    out.append(j)
            return out
        total = sum(j.mem_at(j.progress_at(now)) for j in gpu.jobs)
        if total <= gpu.spec.memory_mb + _MEM_TOL_MB / 2:
            return []
        return [self._grower(gpu)]

    def _grower(self, gpu: _Gpu) -> _Job:
        """The job to blame for an OOM: the fastest-growing one, else the last placed."""
        now = self.now

        def key(j: _Job) -> tuple[float, float, int]:
            growth = 0.0 if j.paused else j.mem_slope(j.progress_at(now)) * j.rate
            return (growth, j.last_start, j.seq)

        return max(gpu.jobs, key=key)

    def _oom(self, job: _Job, why: str, beside: Sequence[_Job] = ()) -> None:
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

    def _advance(self, job: _Job) -> None:
        if job.rate > 0.0:
            job.progress = min(1.0, job.progress + job.rate * (self.now - job.t_last))
        job.t_last = self.now

    def _release(self, job: _Job) -> None:
        """Take a running job off its GPUs and cores."""
        self._advance(job)
        self._observe_window(job, reopen=False)
        job.run_s += self.now - job.last_start
        self._charge(job)
        job.dp = None
        for gpu in job.gpus:
            gpu.jobs.remove(job)
            if job.placement is not None and job.placement.mig_profile:
                gpu.mig_used -= self._mig_slices(gpu, job.placement.mig_profile)
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

    def _end_job(self, job: _Job, reason: EndReason) -> None:
        if job.status == _RUNNING:
            self._release(job)
        elif job.status == _PENDING:
            self.pending.pop(job.spec.id, None)
            self.pending_specs.pop(job.spec.id, None)
            self.pending_tuple = None
        job.status = _DONE
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

    def _to_queue(self, job: _Job, *, keep_progress: bool) -> None:
        self._release(job)
        job.status = _PENDING
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
            if job.status != _RUNNING:
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
                    job.obs_t, job.obs_p, job.obs_ctx = self.now, self._declared(job), ctx
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
            gpu.util = self._util(gpu)
            self.busy += gpu.util - old
            self._forecast_oom(gpu)
        return killed

    def _rate(self, job: _Job) -> tuple[float, _Gpu | None]:
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

    def _gpu_factor(self, job: _Job, gpu: _Gpu) -> float:
        mode = gpu.mode
        # Sharing hook: a model that needs placements (MPS percentages, MIG instances)
        # answers for every mode (scheduler.simulator.sharing.SharingModel).
        by_placement = getattr(self.interference, "gpu_factor", None)
        if by_placement is not None:
            co = [(j.spec, j.placement) for j in gpu.jobs if j is not job and not j.paused]
            return by_placement(
                job.spec, job.placement, gpu.spec, mode, co, self.config.context_switch_overhead
            )
        if mode == SharingMode.MIG:
            slices = self._mig_slices(gpu, job.mig_profile)
            total = gpu.spec.mig_total_slices or slices
            return (slices / total) ** self.config.mig_speed_exponent
        if mode == SharingMode.EXCLUSIVE or mode is None:
            return 1.0
        co_specs = [j.spec for j in gpu.jobs if j is not job and not j.paused]
        if not co_specs:
            return 1.0
        part = 1.0
        if self.interference is not None:
            part = self.interference.slowdown(job.spec, co_specs, gpu.spec, mode)
            if math.isinf(part) or math.isnan(part):
                return 0.0
            part = max(1.0, part)
        if mode == SharingMode.TIME_SLICING:
            return 1.0 / ((1 + len(co_specs)) * (1.0 + self.config.context_switch_overhead) * part)
        return 1.0 / part

    def _schedule_job(self, job: _Job) -> None:
        if job.rate <= 0.0:
            return
        t_end = self.now + (1.0 - job.progress) / job.rate
        bound = job.next_bound(job.progress)
        if bound is not None and bound < 1.0:
            t_bound = self.now + (bound - job.progress) / job.rate
            if t_bound < t_end:
                job.target = bound
                self._push(t_bound, _JOB, job, job.version)
                return
        job.target = 1.0
        self._push(t_end, _JOB, job, job.version)

    def _forecast_oom(self, gpu: _Gpu) -> None:
        """Push an OOM check for when the jobs on ``gpu`` will outgrow it at current speeds."""
        if not gpu.jobs or not gpu.live:
            return
        now = self.now
        if gpu.mode == SharingMode.MIG:
            best = math.inf
            for j in gpu.jobs:
                p = j.progress_at(now)
                growth = 0.0 if j.paused else j.mem_slope(p) * j.rate
                room = self._mig_memory(gpu, j) + _MEM_TOL_MB - j.mem_at(p)
                if room <= _MEM_TOL_MB / 2:
                    best = now
                elif growth > 0:
                    best = min(best, now + room / growth)
            if best < math.inf:
                self._push(best, _OOM, gpu, gpu.version)
            return
        total = 0.0
        growth = 0.0
        for j in gpu.jobs:
            p = j.progress_at(now)
            total += j.mem_at(p)
            if not j.paused:
                growth += j.mem_slope(p) * j.rate
        room = gpu.spec.memory_mb + _MEM_TOL_MB - total
        if room <= _MEM_TOL_MB / 2:
            self._push(now, _OOM, gpu, gpu.version)
        elif growth > 0:
            self._push(now + room / growth, _OOM, gpu, gpu.version)

    def _util(self, gpu: _Gpu) -> float:
        if gpu.mode == SharingMode.MIG:
            total = gpu.spec.mig_total_slices or 1
            used = sum(self._mig_slices(gpu, j.mig_profile) for j in gpu.jobs if not j.paused)
            return min(1.0, used / total)
        return 1.0 if any(not j.paused for j in gpu.jobs) else 0.0

    @staticmethod
    def _mig_slices(gpu: _Gpu, profile: str | None) -> int:
        for p in gpu.spec.mig_profiles:
            if p.name == profile:
                return p.compute_slices
        return 0

    @staticmethod
    def _mig_memory(gpu: _Gpu, job: _Job) -> float:
        name = job.placement.mig_profile if job.placement else None
        for p in gpu.spec.mig_profiles:
            if p.name == name:
                return float(p.memory_mb)
        return float(gpu.spec.memory_mb)

    # ------------------------------------------------------------------------------------
    # The policy

    # ------------------------------------------------------------------------------------
    # Observations: what a live cluster would see (scheduler.knowledge)

    def _declared(self, job: _Job) -> float:
        """Progress as the job reports it: done / declared work (capped at 1)."""
        return min(1.0, job.progress_at(self.now) * job.work_factor)

    def _obs_context(self, job: _Job) -> tuple | None:
        """(model, mode, co-runner types, spread, GPUs) of a running, progressing job."""
        if job.status != _RUNNING or job.paused or job.dp is not None or not job.gpus:
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

    def _observe_window(self, job: _Job, *, reopen: bool) -> None:
        """Hand the window since ``job.obs_t`` to the knowledge (if it progressed)."""
        knowledge = self.knowledge
        if knowledge is None:
            return
        ctx = job.obs_ctx
        now = self.now
        if ctx is not None and now > job.obs_t and job.ready_at <= job.obs_t:
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
                    )
                )
        if reopen:
            job.obs_t, job.obs_p = now, self._declared(job)
        else:
            job.obs_ctx = None

    def _sweep_observations(self) -> None:
        """Report every running job's window (the live progress reports) every
        ``SimConfig.observe_every_s`` seconds."""
        if self.knowledge is None or self.now - self.last_sweep < self.config.observe_every_s:
            return
        self.last_sweep = self.now
        for job in self.running.values():
            if job.obs_ctx is not None:
                self._advance(job)
                self._observe_window(job, reopen=True)

    def _call_policy(self) -> None:
        self._sweep_observations()
        state = ClusterState(
            now_s=self.now,
            nodes=self._nodes_snapshot(),
            pending=self._pending_snapshot(),
            running=self._running_snapshot(),
            knowledge=self.knowledge,
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
            and job.status != _RUNNING
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
    # Elastic data-parallel jobs (scheduler.simulator.elastic; docs/simulator.md)

    def _charge(self, job: _Job) -> None:
        """Add the GPU-seconds of the GPUs ``job`` held since the last charge."""
        job.gpu_s += len(job.gpus) * (self.now - job.held_since)
        job.held_since = self.now

    def _curve_job(self, job: _Job, model: str, pl: Placement) -> DataParallelJob | None:
        """The curve model of a job just placed (None: it runs on its profile's solo time)."""
        spec = job.spec
        elastic = spec.elastic_min is not None or spec.elastic_max is not None
        if spec.job_type is None or job.segments:
            return None
        if not (elastic or self.elastic_model.static_jobs):
            return None
        if self.curve_table is None:
            self.curve_table = load_curve_table(self.elastic_model.throughputs)
        if self.curve_table.curve(spec.job_type, model) is None:
            return None
        try:
            dp = DataParallelJob(
                spec,
                model,
                pl.gpu_count,
                pl.is_gang,
                self.curve_table,
                self.elastic_model,
                self.now,
                job.seq,
            )
        except ValueError:  # the curve has no point at this count
            return None
        dp.total *= job.work_factor
        return dp

    def _elastic_config(self, job: _Job) -> en.ElasticConfig:
        """The engine settings the policy uses for ``job`` (its ``config``, with the step K
        its ``step_for`` gives), to know when a window makes a decision due; the engine's
        defaults for a policy without them."""
        cfg = getattr(self.policy, "config", None)
        if not isinstance(cfg, en.ElasticConfig):
            return en.ElasticConfig()
        step_for = getattr(self.policy, "step_for", None)
        rj = self.rj.get(job.spec.id)
        if callable(step_for) and rj is not None:
            # K depends on the job's first node only: asked once per (job, node), not at
            # every window (a snapshot of every node each time)
            key = (job.spec.id, rj.placement.node)
            k = self._step_k.get(key)
            if k is None:
                state = ClusterState(
                    now_s=self.now, nodes=self._nodes_snapshot(), pending=(), running=()
                )
                try:
                    k = self._step_k[key] = int(step_for(rj, state))
                except (KeyError, TypeError, ValueError):
                    return cfg
            if k >= 1 and k != cfg.scale_step_workers:
                return replace(cfg, scale_step_workers=k)
        return cfg

    def _elastic_state(self, job: _Job) -> en.ElasticState | None:
        dp = job.dp
        if dp is None or dp.state is None:
            return None
        done = job.progress_at(self.now) * dp.total
        start = job.first_start if job.first_start is not None else self.now
        return replace(
            dp.state,
            remaining_steps=max(0.0, dp.total - done) / dp.unit,
            elapsed_s=self.now - start,
        )

    def _dp_watch(self, job: _Job) -> None:
        """After a warm-up or regroup: an elastic job measures (windows), a static one runs
        until its next persistent fault."""
        dp = job.dp
        if dp is None:
            return
        if dp.state is not None and dp.pending is None:
            dp.ranks.skip_blips(self.now)
            self._dp_window(job, dp)
        else:
            self._dp_steady(job, dp)

    def _dp_window(self, job: _Job, dp: DataParallelJob) -> None:
        dp.streaming = True
        dp.timer += 1
        length = dp.start_window(self.now)
        self._push(self.now + length, _DP_TIMER, job, dp.timer)
        self.touched_jobs.add(job)

    def _dp_steady(self, job: _Job, dp: DataParallelJob) -> None:
        """No window watched: the job runs at its current ranks' speed until the next fault."""
        dp.streaming = False
        dp.timer += 1
        dp.steady(self.now)
        nxt = dp.ranks.next_fault_s()
        if nxt < math.inf:
            self._push(max(nxt, self.now), _DP_TIMER, job, dp.timer)
        self.touched_jobs.add(job)

    def _on_dp_timer(self, job: _Job, version: int) -> bool:
        """A window ends (fold it in; True if a decision is now due) or, unwatched, a rank
        turns straggler (an elastic job starts watching again)."""
        dp = job.dp
        if job.status != _RUNNING or dp is None or version != dp.timer:
            return False
        self._advance(job)
        if dp.window is None:  # a fault while nobody watched
            if dp.state is not None and dp.pending is None and job.ready_at <= self.now:
                dp.steady(self.now)
                dp.ranks.skip_blips(self.now)
                self._dp_window(job, dp)
            else:
                self._dp_steady(job, dp)
            return False
        cfg = self._elastic_config(job)
        start = job.first_start if job.first_start is not None else self.now
        dp.end_window(self.now, job.progress * dp.total, cfg, start)
        self.rj_dirty.add(job)
        if dp.state is None or dp.declared is None:
            self._dp_steady(job, dp)
            return False
        decision = en.decide(dp.state, dp.declared, cfg)
        if decision.kind == en.DecisionKind.HOLD and (not decision.converged or dp.suspect):
            self._dp_window(job, dp)  # still measuring, or watching a potential straggler
            return False
        self._dp_steady(job, dp)
        return decision.kind != en.DecisionKind.HOLD

    def _elastic_event(self, job: _Job, kind: str, w_from: int, w_to: int, text: str) -> None:
        self.elastic_events.append(ElasticEvent(self.now, job.spec.id, kind, w_from, w_to, text))

    def _idle_of_model(self, job: _Job, n: int) -> list[_Gpu]:
        """Up to ``n`` idle GPUs of the job's model, its own nodes first, cluster order, none
        that the plan being applied places a job on (the ``elastic`` policy's order)."""
        own = {node.name for node in job.nodes}
        free = [
            g
            for node in self.nodes
            for g in node.gpus
            if not g.jobs
            and g.spec.model == job.model
            and (node.name, g.index) not in self.reserved
        ]
        free.sort(key=lambda g: g.node.name not in own)
        return free[:n]

    def _apply_elastic(self, job: _Job, action: Action) -> bool:
        """SET_WORKERS / REPLACE_WORKERS on an elastic job (False: skipped, logged)."""
        dp = job.dp
        kind = str(action.kind)
        w = dp.workers if dp is not None else len(job.gpus)

        def skip(why: str, target: int = w) -> bool:
            self.ignored_actions += 1
            self._elastic_event(job, f"skipped {kind}", w, target, f"{why} ({action.explanation})")
            return False

        if job.status != _RUNNING or dp is None or dp.state is None:
            return skip("not a running elastic job on a measured curve")
        if dp.pending is not None:
            return skip("a change is under way")
        if action.kind == ActionKind.REPLACE_WORKERS:
            try:
                ranks = tuple(sorted({int(r) for r in action.value or ()}))
            except (TypeError, ValueError):
                return skip(f"bad ranks {action.value!r}")
            if not ranks or ranks[0] < 0 or ranks[-1] >= w:
                return skip(f"ranks {ranks} are not ranks of its {w} workers")
            spares = self._idle_of_model(job, len(ranks))
            if len(spares) < len(ranks):
                return skip(f"no idle spare {job.model}: needs {len(ranks)}, {len(spares)} idle")
            self._dp_begin(
                job,
                dp,
                Transition(
                    "replace", w, ranks, list(spares), dp.local, action.explanation, self.now
                ),
            )
            self._elastic_event(job, kind, w, w, f"ranks {list(ranks)}: {action.explanation}")
            return True
        value = action.value if isinstance(action.value, Mapping) else {"workers": action.value}
        try:
            target = int(value["workers"])
            asked = value.get("local_batch")
            asked = int(asked) if asked else None
        except (KeyError, TypeError, ValueError):
            return skip(f"bad value {action.value!r}")
        if target == w:
            return False
        if target < 1:
            return skip(f"{target} workers", target)
        local = dp.local_for(target, asked)
        if target > w:
            extra = self._idle_of_model(job, target - w)
            if len(extra) < target - w:
                return skip(f"needs {target - w} idle {job.model}, {len(extra)} idle", target)
            spread = len({g.node for g in [*job.gpus[:w], *extra]}) > 1
            if not dp.can_run(target, spread, local):
                return skip(f"no measured throughput at {target} GPUs", target)
            self._dp_begin(
                job,
                dp,
                Transition("scale", target, (), list(extra), local, action.explanation, self.now),
            )
            self._elastic_event(job, kind, w, target, action.explanation)
            return True
        # shrink now: stragglers go first, then the last ranks
        cfg = self._elastic_config(job)
        ewma = dp.state.straggler_ewma
        order = sorted(range(w), key=lambda i: (ewma[i] >= cfg.straggler_threshold, -i))
        drop = set(order[: w - target])
        keep = [i for i in range(w) if i not in drop]
        gpus = [job.gpus[i] for i in keep]
        spread = len({g.node for g in gpus}) > 1
        if not dp.can_run(target, spread, local):
            return skip(f"no measured throughput at {target} GPUs", target)
        self._hold(job, gpus)
        self.freed_for_queue = True
        dp.ranks.keep(keep)
        dp.set_group(target, spread, local)
        state = en.changed(dp.state, target)
        dp.state = replace(state, straggler_ewma=tuple(ewma[i] for i in keep))
        self._elastic_event(job, kind, w, target, action.explanation)
        self._dp_regroup(job, dp)
        return True

    def _dp_begin(self, job: _Job, dp: DataParallelJob, change: Transition) -> None:
        """Hold the new GPUs (or spares) while they warm up; the job trains on meanwhile."""
        self._hold(job, [*job.gpus, *change.gpus])  # type: ignore[list-item]
        dp.pending = change
        dp.serial += 1
        if dp.state is not None:
            dp.state = en.begin_transition(dp.state)
        self._push(self.now + self.elastic_model.warmup_s, _DP_READY, job, dp.serial)
        self._dp_steady(job, dp)
        self.rj_dirty.add(job)

    def _on_dp_ready(self, job: _Job, version: int) -> None:
        """The warm-up is over: the new group forms (a regroup pause), the straggler leaves."""
        dp = job.dp
        if job.status != _RUNNING or dp is None or version != dp.serial or dp.pending is None:
            return
        self._advance(job)
        change, dp.pending = dp.pending, None
        w = dp.workers
        new: list[_Gpu] = list(change.gpus)  # type: ignore[arg-type]
        active = job.gpus[:w]
        if change.kind == "replace":
            for rank, spare in zip(change.ranks, new, strict=True):
                active[rank] = spare
            self._hold(job, active)
            dp.ranks.heal(change.ranks, self.now)
            dp.set_group(w, len({g.node for g in active}) > 1, dp.local)
            if dp.state is not None:
                dp.state = en.replaced(dp.state, change.ranks)
            text = f"ranks {list(change.ranks)} replaced by warmed spares"
        else:
            gpus = [*active, *new]
            self._hold(job, gpus)
            dp.ranks.add(len(new), self.now)
            dp.set_group(change.target, len({g.node for g in gpus}) > 1, change.local_batch)
            if dp.state is not None:
                dp.state = en.changed(dp.state, change.target)
            text = f"{w} -> {change.target} workers, local batch {dp.local}"
        self._elastic_event(job, "applied", w, dp.workers, f"{text} ({change.reason})")
        self._dp_regroup(job, dp)

    def _dp_regroup(self, job: _Job, dp: DataParallelJob) -> None:
        """The group changes: no training for ``regroup_s``, then the job measures again."""
        job.ready_at = max(job.ready_at, self.now + self.elastic_model.regroup_s)
        self._push(job.ready_at, _READY, job)
        self._dp_steady(job, dp)
        self.rj_dirty.add(job)

    def _hold(self, job: _Job, gpus: list[_Gpu]) -> None:
        """Make ``gpus`` (ranks in order, then warming ones) the job's GPUs: attach the new,
        detach the others, rebuild its placement (added nodes bring no cores; a node it
        leaves gets its cores back) and charge the GPU time held so far."""
        self._advance(job)
        self._charge(job)
        pl = job.placement
        if pl is None:  # a running job always has one
            raise SimulationError(f"job {job.spec.id!r} runs without a placement")
        old, new = set(job.gpus), set(gpus)
        for g in job.gpus:
            if g not in new:
                g.jobs.remove(job)
                if not g.jobs:
                    g.mode = None
                self.touched_gpus.add(g)
        for g in gpus:
            if g not in old:
                g.jobs.append(job)
                g.mode = pl.mode
                self.touched_gpus.add(g)
        nodes: list[_Node] = []
        for g in gpus:
            if g.node not in nodes:
                nodes.append(g.node)
        cpus = {part.node: part.cpus for part in pl.parts}
        names = {n.name for n in nodes}
        for name, c in cpus.items():
            if name not in names:
                self.node_by_name[name].free_cores += c
        parts = [
            PlacementPart(n.name, tuple(g.index for g in gpus if g.node is n), cpus.get(n.name, 0))
            for n in nodes
        ]
        job.placement = replace(
            pl,
            node=parts[0].node,
            gpu_indices=parts[0].gpu_indices,
            cpus=parts[0].cpus,
            more=tuple(parts[1:]),
        )
        self.dirty_nodes.update(job.nodes)
        self.dirty_nodes.update(nodes)
        job.nodes = nodes
        job.gpus = list(gpus)
        self.touched_jobs.add(job)
        self.rj_dirty.add(job)
        self.running_tuple = None

    def _apply_decision(self, pl: Placement, explanation: str) -> None:
        """Validate ``pl`` (every part of a gang: node, cores, GPU indices, one GPU model,
        mode and memory on every GPU) and start the job; PolicyDecisionError if impossible."""
        name = self.policy_name
        job = self.by_id.get(pl.job_id)
        if job is None:
            raise PolicyDecisionError(name, pl.job_id, "placed a job that does not exist")
        if job.status != _PENDING or pl.job_id not in self.pending:
            raise PolicyDecisionError(
                name,
                pl.job_id,
                f"placed a job that is {job.status}, not pending (placed twice?)",
            )
        parts = pl.parts
        nodes: list[_Node] = []
        for part in parts:
            node = self.node_by_name.get(part.node)
            if node is None:
                raise PolicyDecisionError(name, pl.job_id, f"placed on unknown node {part.node!r}")
            if node in nodes:
                raise PolicyDecisionError(name, pl.job_id, f"lists node {node.name} twice")
            if part.cpus > node.free_cores:
                raise PolicyDecisionError(
                    name,
                    pl.job_id,
                    f"over-commits CPU cores on {node.name}: needs {part.cpus}, "
                    f"{node.free_cores} of {node.cores} free",
                )
            nodes.append(node)
        spec = job.spec
        gpus: list[_Gpu] = []
        ref: float | None
        if pl.gpu_count:
            if pl.gpu_count != spec.gpus:
                over = f" over {len(parts)} nodes" if pl.is_gang else ""
                raise PolicyDecisionError(
                    name,
                    pl.job_id,
                    f"needs {spec.gpus} GPU(s) but was given {pl.gpu_count}{over}",
                )
            for part, node in zip(parts, nodes, strict=True):
                if not part.gpu_indices:
                    raise PolicyDecisionError(
                        name, pl.job_id, f"a gang part on {node.name} has no GPU"
                    )
                if len(set(part.gpu_indices)) != len(part.gpu_indices):
                    raise PolicyDecisionError(
                        name, pl.job_id, f"lists a GPU of {node.name} twice: {part.gpu_indices}"
                    )
                for idx in part.gpu_indices:
                    if not 0 <= idx < len(node.gpus):
                        raise PolicyDecisionError(
                            name,
                            pl.job_id,
                            f"placed on GPU {idx} of {node.name}, which has "
                            f"{len(node.gpus)} GPU(s)",
                        )
                    gpus.append(node.gpus[idx])
            models = sorted({g.spec.model for g in gpus})
            if len(models) > 1:
                raise PolicyDecisionError(
                    name, pl.job_id, f"mixes GPU models {', '.join(models)} in one job"
                )
            model: str | None = models[0]
            ref = spec.solo_time_s(model)
            if ref is None:
                raise PolicyDecisionError(
                    name, pl.job_id, f"has no solo time for GPU model {model} in its profile"
                )
            solo = self._spread_time(spec, models[0], ref) if pl.is_gang else ref
            mem = job.mem_at(job.progress)
            for gpu in gpus:
                self._check_gpu_fits(job, gpu, pl, mem)
        else:
            if pl.is_gang:
                raise PolicyDecisionError(
                    name, pl.job_id, "a CPU placement (no GPU) spread over several nodes"
                )
            node = nodes[0]
            if spec.profile is None or spec.profile.cpu_time_s is None:
                raise PolicyDecisionError(
                    name,
                    pl.job_id,
                    f"placed on CPU ({node.name}) but its profile has no cpu_time_s",
                )
            model = None
            solo = ref = spec.profile.cpu_time_s
        # Apply.
        self._advance(job)
        self.pending.pop(pl.job_id)
        self.pending_specs.pop(pl.job_id)
        self.pending_tuple = None
        job.status = _RUNNING
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
                self._push(job.ready_at, _READY, job)
        if job.restart_cost > 0:  # checkpoint restore after a preemption: no progress yet
            job.ready_at = max(job.ready_at, self.now + job.restart_cost)
            job.restart_cost = 0.0
            self._push(job.ready_at, _READY, job)
        for node, part in zip(nodes, parts, strict=True):
            node.free_cores -= part.cpus
            self.dirty_nodes.add(node)
            if job.segments and gpus:
                self._count_live(node, +1)
        for gpu in gpus:
            gpu.jobs.append(job)
            gpu.mode = pl.mode
            if pl.mode == SharingMode.MIG:
                gpu.mig_used += self._mig_slices(gpu, pl.mig_profile)
                self._mig_place(job, gpu, pl)
            self.touched_gpus.add(gpu)
        self.touched_jobs.add(job)
        self.running[pl.job_id] = job
        self.rj_dirty.add(job)
        self.running_tuple = None

    def _mig_place(self, job: _Job, gpu: _Gpu, pl: Placement) -> None:
        """Sharing hook: the job takes a MIG instance; creating one delays its start."""
        try:
            delay = self.mig.place((gpu.node.name, gpu.index), gpu.spec, job.spec.id, pl)
        except MigLayoutError as exc:
            raise PolicyDecisionError(self.policy_name, pl.job_id, str(exc)) from exc
        if delay > 0:
            job.ready_at = max(job.ready_at, self.now + delay)
            self._push(job.ready_at, _READY, job)

    def _spread_time(self, spec: JobSpec, model: str, solo: float) -> float:
        """Solo time of ``spec`` spread over several nodes of ``model``: its profile's
        unconsolidated time (measured), else ``solo / SimConfig.unconsolidated_speed``."""
        measured = spec.profile.gpu_time_unconsolidated_s.get(model) if spec.profile else None
        if measured is not None:
            return measured
        return solo / self.config.unconsolidated_speed

    def _count_live(self, node: _Node, delta: int) -> None:
        if delta > 0 and self.memory_ticks and not self.tick_armed and self.tick_every:
            self._push(self.now + self.tick_every, _TICK, None)
            self.tick_armed = True
        n = self.live_nodes.get(node, 0) + delta
        if n > 0:
            self.live_nodes[node] = n
        else:
            self.live_nodes.pop(node, None)
            self.dirty_nodes.add(node)

    def _check_gpu_fits(self, job: _Job, gpu: _Gpu, pl: Placement, mem: float) -> None:
        name, label = self.policy_name, gpu.label()
        if not gpu.spec.supports(pl.mode):
            raise PolicyDecisionError(
                name,
                pl.job_id,
                f"asks for {pl.mode} on {label}, a {gpu.spec.model} that "
                f"supports {', '.join(m.value for m in gpu.spec.sharing_modes)}",
            )
        if gpu.jobs:
            if gpu.mode == SharingMode.EXCLUSIVE or pl.mode == SharingMode.EXCLUSIVE:
                others = ", ".join(j.spec.id for j in gpu.jobs)
                raise PolicyDecisionError(
                    name, pl.job_id, f"double-books {label} (exclusive; running {others})"
                )
            if gpu.mode != pl.mode:
                raise PolicyDecisionError(
                    name, pl.job_id, f"asks for {pl.mode} on {label}, which runs in {gpu.mode}"
                )
            if pl.mode == SharingMode.MPS and any(j.spec.owner != job.spec.owner for j in gpu.jobs):
                raise PolicyDecisionError(
                    name,
                    pl.job_id,
                    f"puts owner {job.spec.owner!r} under MPS on {label} next to another owner's "
                    "jobs (MPS serves one unix user per GPU)",
                )
        if pl.mode == SharingMode.MIG:
            profile = next((p for p in gpu.spec.mig_profiles if p.name == pl.mig_profile), None)
            if profile is None:
                known = ", ".join(p.name for p in gpu.spec.mig_profiles) or "none"
                raise PolicyDecisionError(
                    name,
                    pl.job_id,
                    f"MIG profile {pl.mig_profile!r} does not exist on "
                    f"{gpu.spec.model} (known: {known})",
                )
            if gpu.mig_used + profile.compute_slices > gpu.spec.mig_total_slices:
                raise PolicyDecisionError(
                    name,
                    pl.job_id,
                    f"over-commits MIG slices on {label}: "
                    f"{gpu.mig_used} + {profile.compute_slices} > {gpu.spec.mig_total_slices}",
                )
            if mem > profile.memory_mb + _MEM_TOL_MB:
                raise PolicyDecisionError(
                    name,
                    pl.job_id,
                    f"over-commits memory of MIG instance {profile.name} on "
                    f"{label}: needs {mem:.0f} MB of {profile.memory_mb} MB",
                )
            return
        used = sum(j.mem_at(j.progress_at(self.now)) for j in gpu.jobs)
        if used + mem > gpu.spec.memory_mb + _MEM_TOL_MB:
            raise PolicyDecisionError(
                name,
                pl.job_id,
                f"over-commits memory on {label}: {used:.0f} MB in use + "
                f"{mem:.0f} MB > {gpu.spec.memory_mb} MB",
            )

    # ------------------------------------------------------------------------------------
    # Snapshots (cached: only what changed is rebuilt)

    def _nodes_snapshot(self) -> tuple[NodeState, ...]:
        dirty = self.dirty_nodes
        live = self.live_nodes
        if dirty or live or self.nodes_tuple is None:
            for node in (*dirty, *live):
                self.node_states[node.spec_index] = self._node_state(node)
            self.dirty_nodes = set()
            self.nodes_tuple = tuple(self.node_states)
        return self.nodes_tuple

    def _node_state(self, node: _Node) -> NodeState:
        now = self.now
        gpus = []
        for g in node.gpus:
            used = 0.0
            committed = 0.0
            for j in g.jobs:
                used += j.mem_at(j.progress_at(now))
                committed += j.spec.memory_need_mb()
            gpus.append(
                GpuState(
                    node=node.name,
                    index=g.index,
                    spec=g.spec,
                    mode=g.mode,
                    job_ids=tuple(j.spec.id for j in g.jobs),
                    committed_memory_mb=committed,
                    used_memory_mb=used,
                    util_pct=100.0 * g.util,
                    mig_slices_used=g.mig_used,
                    mig_layout=self.mig.layout((node.name, g.index)),
                )
            )
        return NodeState(
            name=node.name,
            kind=node.kind,
            cores=node.cores,
            free_cores=node.free_cores,
            memory_mb=node.memory_mb,
            gpus=tuple(gpus),
        )

    def _pending_snapshot(self) -> tuple[JobSpec, ...]:
        if self.pending_tuple is None:
            self.pending_tuple = tuple(self.pending_specs.values())
        return self.pending_tuple

    def _running_snapshot(self) -> tuple[RunningJob, ...]:
        now = self.now
        heap = self.rj_refresh
        stale: set[_Job] = set(self.rj_dirty)
        while heap and heap[0][0] <= now:
            _, _, version, job = heapq.heappop(heap)
            if job.rj_version == version and job.status == _RUNNING:
                stale.add(job)
        if stale or self.running_tuple is None:
            step = self.config.snapshot_progress_step
            for job in sorted(stale, key=lambda j: j.seq):
                if job.status != _RUNNING:
                    continue
                job.rj_version += 1
                placement = job.placement
                if placement is None:  # a running job always has one
                    raise SimulationError(f"job {job.spec.id!r} runs without a placement")
                self.rj[job.spec.id] = RunningJob(
                    job=job.spec,
                    placement=placement,
                    started_s=job.last_start,
                    # What the job reports: steps done / declared steps (estimate).
                    progress=min(1.0, job.progress_at(now) * job.work_factor),
                    paused=job.paused,
                    elastic=self._elastic_state(job),
                )
                if job.rate > 0.0:
                    heapq.heappush(heap, (now + step / job.rate, job.seq, job.rj_version, job))
            self.rj_dirty = set()
            self.running_tuple = tuple(self.rj.values())
        return self.running_tuple

    # ------------------------------------------------------------------------------------
    # Recording

    def _record_timeline(self) -> None:
        paused = self.n_paused
        point = TimelinePoint(
            self.now, self.busy, len(self.pending), len(self.running) - paused, paused
        )
        if self.timeline:
            last = self.timeline[-1]
            if (last.busy_gpus, last.queued, last.running, last.paused) == (
                point.busy_gpus,
                point.queued,
                point.running,
                point.paused,
            ):
                return
            if last.t_s == point.t_s:
                self.timeline[-1] = point
                return
        self.timeline.append(point)

    def _sample_slowdown(self) -> None:
        """Slow-Down of every running job (ALGORITHMS §5): (now - start + expected remaining
        time at its current speed) / solo time; a paused job's remaining time at solo speed."""
        now = self.now
        values = []
        for job in self.running.values():
            if job.ref_s <= 0 or job.first_start is None:
                continue
            p = job.progress_at(now)
            remaining = (1.0 - p) / job.rate if job.rate > 0 else (1.0 - p) * job.solo_s
            values.append((now - job.first_start + remaining) / job.ref_s)
        if not values:
            return
        lo, hi = min(values), max(values)
        self.samples.append(
            SlowdownSample(now, len(values), sum(values) / len(values), lo, hi, hi - lo)
        )

    def _finish(self, stopped_early: bool, wall_s: float) -> SimResult:
        for job in self.jobs:
            if job.status == _DONE:
                continue
            if job.status == _RUNNING:
                self._release(job)
                job.reason = EndReason.UNFINISHED
            elif stopped_early or job.spec.arrival_s > self.now:
                job.reason = EndReason.UNFINISHED
            else:
                job.reason = EndReason.UNSCHEDULABLE
                job.waiting = self.last_waiting.get(job.spec.id, "")
                if job.waiting:
                    job.explanation = job.waiting
            job.status = _DONE
        self._record_timeline()
        records = [self._record(j) for j in self.jobs]
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

    def _record(self, job: _Job) -> JobRecord:
        spec = job.spec
        pl = job.placement
        completed = job.reason == EndReason.COMPLETED
        finish = job.finish if completed else None
        start = job.first_start
        run = finish - start if finish is not None and start is not None else None
        solo = job.ref_s if pl is not None else None
        location = ""
        if pl is not None:
            location = "+".join(
                f"{part.node}/" + (",".join(map(str, part.gpu_indices)) or "cpu")
                for part in pl.parts
            )
        slowdown = run / solo if run is not None and solo else None
        return JobRecord(
            job_id=spec.id,
            name=spec.name,
            job_type=spec.job_type,
            gpus=spec.gpus,
            arrival_s=spec.arrival_s,
            start_s=start,
            finish_s=finish,
            end_s=job.finish,
            end_reason=str(job.reason),
            location=location,
            nodes=len(pl.parts) if pl is not None else 0,
            gpu_model=job.model if pl is not None else None,
            mode=(str(pl.mode) if pl.gpu_indices else "cpu") if pl is not None else None,
            solo_s=solo,
            jct_s=finish - spec.arrival_s if finish is not None else None,
            queue_s=start - spec.arrival_s if start is not None else None,
            run_s=run,
            slowdown=slowdown,
            speedup=1.0 / slowdown if slowdown else None,
            oom_count=job.oom_count,
            restarts=job.restarts,
            preemptions=job.preemptions,
            paused_s=job.paused_total,
            explanation=job.explanation or job.waiting,
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
