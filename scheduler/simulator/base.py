"""What every part of the simulator shares: the clock, the event queue, the simulated cluster
and its jobs, and the snapshots the policy sees.

``SimulatorBase`` is built from the cluster, the trace, the policy and the config (the
``Simulator`` of ``scheduler.simulator.engine`` adds the event loop on top, and
``scheduler.simulator.elastic_jobs`` the elastic data-parallel jobs in between). Besides the
state it holds the primitives both use: pushing an event, advancing a job's progress to now,
charging GPU-seconds, moving a job onto other GPUs (``_hold``), and the cached snapshots
(``ClusterState`` parts: only what changed since the last policy call is rebuilt).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from itertools import count

from scheduler import elastic as en
from scheduler.admission import capacity_of
from scheduler.cluster_spec import ClusterSpec
from scheduler.domain import GpuState, JobSpec, NodeState, PlacementPart, RunningJob
from scheduler.interference import InterferenceModel
from scheduler.knowledge import Knowledge
from scheduler.knowledge.priors import truth_pair_prior
from scheduler.policies.base import Policy
from scheduler.simulator.elastic import CurveTable, ElasticModel
from scheduler.simulator.results import (
    ElasticEvent,
    SimConfig,
    SimulationError,
    SlowdownSample,
    TimelinePoint,
)
from scheduler.simulator.sharing import MigBook
from scheduler.simulator.state import RUNNING, SimGpu, SimJob, SimNode

# Event kinds; the number orders simultaneous events (completions free memory before the OOM
# checks, and both before arrivals and ticks).
(
    EVENT_JOB,
    EVENT_OOM,
    EVENT_ARRIVAL,
    EVENT_TICK,
    EVENT_SAMPLE,
    EVENT_READY,
    EVENT_DP_TIMER,
    EVENT_DP_READY,
) = range(8)


class _Attained(Mapping[str, float]):
    """``ClusterState.attained_s`` of a simulation: seconds each job has held a placement,
    every attempt, up to now (what a live cluster's attempt history says), read on lookup."""

    __slots__ = ("sim",)

    def __init__(self, sim: SimulatorBase) -> None:
        self.sim = sim

    def __getitem__(self, job_id: str) -> float:
        sim = self.sim
        job = sim.by_id[job_id]
        if job.status == RUNNING:
            return job.run_s + (sim.now - job.last_start)
        return job.run_s

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.sim.by_id

    def __iter__(self) -> Iterator[str]:
        return iter(self.sim.by_id)

    def __len__(self) -> int:
        return len(self.sim.by_id)


class SimulatorBase:
    """The state of one simulation and the primitives on it (see the module docstring); the
    constructor's arguments are ``Simulator``'s."""

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
        if self.config.hide_lengths > 0:
            from scheduler.estimates import with_hidden_lengths

            jobs, drawn = with_hidden_lengths(jobs, self.config.hide_lengths, self.config.seed)
            for k, v in drawn.items():
                truth[k] = truth.get(k, 1.0) * v
        self.jobs = [SimJob(spec, i, truth.get(spec.id, 1.0)) for i, spec in enumerate(jobs)]
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
        self.sweep_times: list[float] = []  # the instants of the progress-report sweeps
        # (due time, job seq, window generation, job): windows due for their next report
        self.obs_due: list[tuple[float, int, int, SimJob]] = []
        self.by_id = {j.spec.id: j for j in self.jobs}
        # Seconds each job has run (``ClusterState.attained_s``), read on lookup.
        self.attained = _Attained(self)
        self.nodes: list[SimNode] = []
        self.node_by_name: dict[str, SimNode] = {}
        for i, ns in enumerate(cluster.nodes):
            node = SimNode(i, ns.name, ns.kind, ns.cores, ns.memory_mb)
            if ns.gpu_model is not None:
                spec = cluster.gpu_spec(ns.gpu_model)
                node.gpus = [SimGpu(node, k, spec) for k in range(ns.gpu_count)]
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
        self.pending: dict[str, SimJob] = {}  # queue order
        self.pending_specs: dict[str, JobSpec] = {}  # the same, as specs (cheap snapshots)
        self.last_waiting: Mapping[str, str] = {}  # the last plan's reasons for waiting jobs
        self.running: dict[str, SimJob] = {}
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
        self.live_nodes: dict[SimNode, int] = {}  # nodes running jobs with memory steps
        self.memory_ticks = False  # run(): the policy's ticks only watch memory
        self.tick_every: float | None = None
        self.tick_armed = False
        self.idle_calls = 0  # consecutive policy calls that changed nothing
        # Changes since the last recompute.
        self.touched_gpus: set[SimGpu] = set()
        self.touched_jobs: set[SimJob] = set()
        # Snapshot caches.
        self.gpu_states: dict[SimGpu, tuple[int, GpuState]] = {}  # (GPU version, its state)
        self.node_states: list[NodeState] = [self._node_state(n) for n in self.nodes]
        self.dirty_nodes: set[SimNode] = set()
        self.nodes_tuple: tuple[NodeState, ...] | None = None
        self.pending_tuple: tuple[JobSpec, ...] | None = None
        self.rj: dict[str, RunningJob] = {}
        self.rj_dirty: set[SimJob] = set()
        self.rj_refresh: list[tuple[float, int, int, SimJob]] = []
        self.running_tuple: tuple[RunningJob, ...] | None = None

    # ------------------------------------------------------------------------------------
    # Primitives

    def _push(self, t: float, kind: int, obj: object, version: int = 0) -> None:
        heapq.heappush(self.heap, (t, kind, next(self.seq), obj, version))

    def _advance_clock(self, t: float) -> None:
        self.busy_area += self.busy * (t - self.now)
        self.now = t

    def _advance(self, job: SimJob) -> None:
        if job.rate > 0.0:
            job.progress = min(1.0, job.progress + job.rate * (self.now - job.t_last))
        job.t_last = self.now

    def _charge(self, job: SimJob) -> None:
        """Add the GPU-seconds of the GPUs ``job`` held since the last charge."""
        job.gpu_s += len(job.gpus) * (self.now - job.held_since)
        job.held_since = self.now

    def _count_live(self, node: SimNode, delta: int) -> None:
        if delta > 0 and self.memory_ticks and not self.tick_armed and self.tick_every:
            self._push(self.now + self.tick_every, EVENT_TICK, None)
            self.tick_armed = True
        n = self.live_nodes.get(node, 0) + delta
        if n > 0:
            self.live_nodes[node] = n
        else:
            self.live_nodes.pop(node, None)
            self.dirty_nodes.add(node)

    def _hold(self, job: SimJob, gpus: list[SimGpu]) -> None:
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
        nodes: list[SimNode] = []
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

    def _elastic_state(self, job: SimJob) -> en.ElasticState | None:
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

    def _node_state(self, node: SimNode) -> NodeState:
        now = self.now
        gpus = []
        touched = self.touched_gpus
        cache = self.gpu_states
        for g in node.gpus:
            # A GPU's state changes only with its jobs, mode, MIG instances (each marks it
            # touched) or its utilisation (recomputed for touched GPUs, with a new version),
            # and with time only while a job on it has memory steps: else the last one holds.
            hit = cache.get(g)
            if (
                hit is not None
                and hit[0] == g.version
                and g not in touched
                and not any(j.segments for j in g.jobs)
            ):
                gpus.append(hit[1])
                continue
            used = 0.0
            committed = 0.0
            for j in g.jobs:
                used += j.mem_at(j.progress_at(now))
                committed += j.spec.memory_need_mb()
            state = GpuState(
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
            cache[g] = (g.version, state)
            gpus.append(state)
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
        stale = self.rj_dirty
        if heap and heap[0][0] <= now:
            stale = set(stale)
            pop = heapq.heappop
            while heap and heap[0][0] <= now:
                _, _, version, job = pop(heap)
                if job.rj_version == version and job.status == RUNNING:
                    stale.add(job)
        if stale or self.running_tuple is None:
            step = self.config.snapshot_progress_step
            rj = self.rj
            push = heapq.heappush
            # Jobs already in the snapshot keep their place; new ones join in trace order.
            new = [j for j in stale if j.spec.id not in rj]
            if len(new) > 1:
                new.sort(key=lambda j: j.seq)
            for job in (*(j for j in stale if j.spec.id in rj), *new):
                if job.status != RUNNING:
                    continue
                job.rj_version += 1
                placement = job.placement
                if placement is None:  # a running job always has one
                    raise SimulationError(f"job {job.spec.id!r} runs without a placement")
                known = job.spec.length_known
                rate = job.rate if known else 0.0  # no length, no progress to refresh
                done = job.progress_at(now)
                rj[job.spec.id] = RunningJob(
                    job=job.spec,
                    placement=placement,
                    started_s=job.last_start,
                    # What the job reports: steps done / declared steps (estimate); a job
                    # that declared no length reports none.
                    progress=min(1.0, done * job.work_factor) if known else 0.0,
                    paused=job.paused,
                    elastic=None if job.dp is None else self._elastic_state(job),
                )
                if rate > 0.0:
                    push(heap, (now + step / rate, job.seq, job.rj_version, job))
            self.rj_dirty = set()
            self.running_tuple = tuple(rj.values())
        return self.running_tuple
