"""A simulator of data-parallel training jobs whose mini-batches are split over the GPUs of one
node by a data ratio (paper 000, ``slowdown_dr``; ALGORITHMS.md §5; docs/slowdown.md).

The main simulator (``scheduler.simulator.engine``) runs each job at its slowest GPU's speed
and does not model data ratios; this one models what paper 000 changes, one iteration at a time:

- A job has ``epochs * iterations_per_epoch`` iterations; its solo iteration time on the node's
  GPU model is ``w = solo_time / iterations`` (the profile's ``gpu_time_s``: one GPU, alone).
- An iteration is a host phase of ``(1 - u) * w`` (data loading, not contended; ``u`` the
  profile's ``gpu_util_pct`` / 100, 1.0 when unknown) then a device phase: GPU ``g`` gets
  ``u * w * DR[g] / 10`` seconds of solo work, plus ``split_overhead * u * w * (k - 1)`` for
  model replicas and gradient gathering when ``k`` GPUs are used. The iteration ends when its
  slowest share ends (synchronous data parallelism).
- A GPU time-slices the shares queued on it (processor sharing): with ``n`` shares each runs at
  ``1 / (n * (1 + context_switch_overhead) * part)`` of full speed, ``part`` the interference
  model's time-slicing part next to the other jobs (1.0 without a model; clamped to 1..10).
- GPU utilisation (the NVML reading) is the fraction of each ``util_period_s`` a GPU had a share
  queued; the manager reads the last period's value.
- At its epoch end a job publishes SD_i (ALGORITHMS §5: elapsed + iterations left * the
  epoch's mean iteration time, over the solo time); the policy is called with a snapshot in
  which that job has ``epoch_ended`` set, and a ``SET_DATA_RATIO`` action takes effect from
  the job's next iteration, the first of its next epoch. Other actions are counted, not applied.
- The policy also places arriving jobs (its decisions): a job starts with 10/10 on the first GPU
  of its placement (split evenly over the GPUs of a multi-GPU placement).
- Samples every ``sample_interval_s``: each running job's SD (the formula above with the mean
  iteration time of its current epoch so far, else of its last 5 iterations), SD_max_diff and
  the mean GPU utilisation.

What it does not model (docs/slowdown.md): GPU memory (replicas are not charged when a ratio
adds a GPU), MPS (every share is time-sliced), more than one node per job, CPU contention.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler.cluster_spec import ClusterSpec
from scheduler.domain import (
    ActionKind,
    ClusterState,
    DataParallelState,
    GpuSpec,
    GpuState,
    JobSpec,
    NodeKind,
    NodeState,
    Placement,
    RunningJob,
    SharingMode,
)
from scheduler.interference import InterferenceModel
from scheduler.policies.base import Policy
from scheduler.simulator.results import SimulationError
from scheduler.slowdown_dr import RATIO_TOTAL, check_ratio, largest_remainder

_EPS = 1e-9  # seconds of work: below this a share is done


@dataclass(frozen=True, slots=True)
class DpConfig:
    """Settings of the data-parallel simulator (see the module docstring).

    ``epochs`` and ``iterations_per_epoch`` of every job (a job's ``params`` may override them
    with the same keys); ``split_overhead``: fraction of a device phase added per extra GPU;
    ``context_switch_overhead``: fraction, as in ``SimConfig``; ``util_period_s``: the NVML
    sampling period (None: one solo iteration of the shortest job, times 5);
    ``sample_interval_s``: SD sampling period (None: about 300 samples over the longest solo
    run times the jobs per GPU); ``max_time_s``: stop there (jobs left are unfinished).
    """

    epochs: int = 30
    iterations_per_epoch: int = 10
    split_overhead: float = 0.03
    context_switch_overhead: float = 0.05
    util_period_s: float | None = None
    sample_interval_s: float | None = None
    max_time_s: float | None = None
    seed: int = 0
    iteration_jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.iterations_per_epoch < 1:
            raise ValueError("epochs and iterations_per_epoch must be >= 1")
        if not 0 <= self.iteration_jitter < 1:
            raise ValueError("iteration_jitter must be in 0..1")
        if not 0 <= self.split_overhead <= 1 or not 0 <= self.context_switch_overhead <= 1:
            raise ValueError("split_overhead and context_switch_overhead must be in 0..1")


@dataclass(frozen=True, slots=True)
class DpSample:
    """At ``t_s``: running jobs, their mean / min / max SD, SD_max_diff, mean GPU util (%)."""

    t_s: float
    running: int
    mean_sd: float
    min_sd: float
    max_sd: float
    max_diff: float
    util_pct: float


@dataclass(frozen=True, slots=True)
class RatioChange:
    """A ``SET_DATA_RATIO`` the simulator applied (at the job's epoch end ``t_s``)."""

    t_s: float
    job_id: str
    epoch: int
    old: tuple[int, ...]
    new: tuple[int, ...]
    explanation: str


@dataclass(frozen=True, slots=True)
class DpJobRecord:
    """How one job went: ``slowdown`` = (finish - start) / solo time (None: unfinished)."""

    job_id: str
    name: str
    solo_s: float
    start_s: float | None
    finish_s: float | None
    slowdown: float | None
    final_ratio: tuple[int, ...]
    ratio_changes: int


@dataclass(slots=True)
class DpResult:
    policy: str
    gpu_count: int
    jobs: list[DpJobRecord]
    samples: list[DpSample]
    ratio_log: list[RatioChange]
    gpu_busy_s: list[float]
    makespan_s: float
    ignored_actions: int = 0
    unfinished: list[str] = field(default_factory=list)

    @property
    def completed(self) -> bool:
        return not self.unfinished

    def summary(self) -> dict[str, float]:
        """The paper's three quantities, over the time all jobs ran together (``full_*``: the
        samples before the first completion; ``settled_*``: the second half of that window)
        and over the whole run (``mean_job_sd``: completion / solo time averaged over jobs;
        ``util_pct``: GPU-busy time over GPUs x makespan)."""
        n = len(self.jobs)
        full = [s for s in self.samples if s.running == n]
        settled = full[len(full) // 2 :]
        done = [j.slowdown for j in self.jobs if j.slowdown is not None]

        def avg(xs: Sequence[float]) -> float:
            return statistics.fmean(xs) if xs else math.nan

        return {
            "full_sd_max_diff": avg([s.max_diff for s in full]),
            "start_sd_max_diff": full[0].max_diff if full else math.nan,
            "settled_sd_max_diff": avg([s.max_diff for s in settled]),
            "full_mean_sd": avg([s.mean_sd for s in full]),
            "settled_mean_sd": avg([s.mean_sd for s in settled]),
            "full_util_pct": avg([s.util_pct for s in full]),
            "mean_job_sd": avg(done),
            "max_job_sd": max(done) if done else math.nan,
            "util_pct": 100.0 * sum(self.gpu_busy_s) / (self.gpu_count * self.makespan_s)
            if self.makespan_s > 0 and self.gpu_count
            else math.nan,
            "makespan_s": self.makespan_s,
            "ratio_changes": float(len(self.ratio_log)),
        }

    def samples_frame(self):  # type: ignore[no-untyped-def]  # pandas has no type hints
        import pandas as pd  # type: ignore[import-untyped]

        frame = pd.DataFrame([_asdict(s) for s in self.samples], columns=list(DpSample.__slots__))
        frame.insert(0, "policy", self.policy)
        return frame


def _asdict(s: DpSample) -> dict[str, float]:
    return {k: getattr(s, k) for k in DpSample.__slots__}


class _Job:
    def __init__(self, spec: JobSpec, seq: int, solo_s: float, cfg: DpConfig) -> None:
        self.spec = spec
        self.seq = seq
        self.solo_s = solo_s
        params = spec.params or {}
        self.epochs = int(params.get("epochs", cfg.epochs))
        self.ipe = int(params.get("iterations_per_epoch", cfg.iterations_per_epoch))
        self.total = self.epochs * self.ipe
        self.w = solo_s / self.total
        util = spec.profile.gpu_util_pct if spec.profile is not None else None
        self.u = 1.0 if util is None else min(1.0, max(0.0, util / 100.0))
        self.ratio: tuple[int, ...] = ()
        self.next_ratio: tuple[int, ...] | None = None
        self.done_iters = 0
        self.start: float | None = None
        self.finish: float | None = None
        self.host_until: float | None = None  # host phase ends
        self.shares: dict[int, float] = {}  # GPU -> solo-seconds of work left this iteration
        self.iter_start = 0.0
        self.epoch_times: list[float] = []
        self.recent: deque[float] = deque(maxlen=5)
        self.sd: float | None = None
        self.changes = 0
        self.scale = 1.0  # this iteration's jitter factor

    @property
    def epoch(self) -> int:
        return self.done_iters // self.ipe


class DataParallelSimulator:
    """Runs ``jobs`` on the first GPU node of ``cluster`` under ``policy``. Call ``run()`` once."""

    def __init__(
        self,
        cluster: ClusterSpec,
        jobs: Sequence[JobSpec],
        policy: Policy,
        *,
        interference: InterferenceModel | None = None,
        config: DpConfig | None = None,
    ) -> None:
        self.cfg = config or DpConfig()
        self.policy = policy
        self.policy_name = policy.name or type(policy).__name__
        self.interference = interference
        node = next((n for n in cluster.nodes if n.gpu_model and n.gpu_count), None)
        if node is None or node.gpu_model is None:
            raise SimulationError("the data-parallel simulator needs a node with GPUs")
        self.node_name = node.name
        self.gpu_model: str = node.gpu_model
        self.gpu_spec: GpuSpec = cluster.gpu_spec(node.gpu_model)
        self.m = node.gpu_count
        self.cores = node.cores
        self.jobs: list[_Job] = []
        for i, spec in enumerate(jobs):
            solo = spec.solo_time_s(self.gpu_model)
            if solo is None or solo <= 0:
                raise SimulationError(
                    f"job {spec.id!r} has no solo time on {self.gpu_model} in its profile"
                )
            self.jobs.append(_Job(spec, i, solo, self.cfg))
        self.by_id = {j.spec.id: j for j in self.jobs}
        self.rng = random.Random(self.cfg.seed)
        self.noise = random.Random(self.cfg.seed + 1)  # iteration jitter, apart from the policy's
        self.now = 0.0
        self.pending: list[_Job] = []
        self.running: list[_Job] = []
        self.busy = [0.0] * self.m  # GPU-busy seconds, whole run
        self.period_busy = [0.0] * self.m
        self.util = [0.0] * self.m  # last period's utilisation, percent
        shortest = min((j.w for j in self.jobs), default=1.0)
        self.util_period = self.cfg.util_period_s or 5 * shortest
        longest = max((j.solo_s for j in self.jobs), default=1.0)
        per_gpu = max(1.0, len(self.jobs) / self.m)
        self.sample_every = self.cfg.sample_interval_s or longest * per_gpu / 300.0
        self.samples: list[DpSample] = []
        self.ratio_log: list[RatioChange] = []
        self.ignored = 0

    # ------------------------------------------------------------------------------------

    def run(self) -> DpResult:
        arrivals = sorted(self.jobs, key=lambda j: (j.spec.arrival_s, j.seq))
        ai = 0
        next_util = self.util_period
        next_sample = 0.0
        horizon = self.cfg.max_time_s
        guard = 0
        while ai < len(arrivals) or self.running or self.pending:
            guard += 1
            if guard > 50_000_000:  # pragma: no cover
                raise SimulationError("data-parallel simulation does not end")
            t_arr = arrivals[ai].spec.arrival_s if ai < len(arrivals) else math.inf
            t_job = self._next_job_event()
            if not self.running and t_arr == math.inf:
                break  # jobs left pending that the policy never places
            t = min(t_arr, t_job, next_util, next_sample)
            if horizon is not None and t > horizon:
                self._advance(horizon)
                break
            self._advance(t)
            if t == next_sample:
                self._sample()
                next_sample += self.sample_every
            if t == next_util:
                self.util = [100.0 * b / self.util_period for b in self.period_busy]
                self.period_busy = [0.0] * self.m
                next_util += self.util_period
            arrived = False
            while ai < len(arrivals) and arrivals[ai].spec.arrival_s <= t:
                self.pending.append(arrivals[ai])
                ai += 1
                arrived = True
            if arrived:
                self._call_policy(None)
            self._progress_jobs()
        unfinished = [j.spec.id for j in self.jobs if j.finish is None]
        makespan = max((j.finish for j in self.jobs if j.finish is not None), default=self.now)
        if unfinished:
            makespan = self.now
        return DpResult(
            policy=self.policy_name,
            gpu_count=self.m,
            jobs=[self._record(j) for j in self.jobs],
            samples=self.samples,
            ratio_log=self.ratio_log,
            gpu_busy_s=list(self.busy),
            makespan_s=makespan,
            ignored_actions=self.ignored,
            unfinished=unfinished,
        )

    # ------------------------------------------------------------------------------------
    # Execution

    def _rates(self) -> dict[int, dict[_Job, float]]:
        """GPU -> job -> solo-seconds of its share done per second."""
        out: dict[int, dict[_Job, float]] = {}
        for g in range(self.m):
            here = [j for j in self.running if j.shares.get(g, 0.0) > _EPS]
            if not here:
                continue
            n = len(here)
            rates: dict[_Job, float] = {}
            for j in here:
                if n == 1:
                    rates[j] = 1.0
                    continue
                part = 1.0
                if self.interference is not None:
                    co = [o.spec for o in here if o is not j]
                    part = self.interference.slowdown(
                        j.spec, co, self.gpu_spec, SharingMode.TIME_SLICING
                    )
                    part = 10.0 if math.isinf(part) or math.isnan(part) else part
                    part = min(10.0, max(1.0, part))
                rates[j] = 1.0 / (n * (1.0 + self.cfg.context_switch_overhead) * part)
            out[g] = rates
        return out

    def _next_job_event(self) -> float:
        t = math.inf
        for j in self.running:
            if j.host_until is not None:
                t = min(t, j.host_until)
        for g, rates in self._rates().items():
            for j, r in rates.items():
                t = min(t, self.now + j.shares[g] / r)
        return t

    def _advance(self, t: float) -> None:
        dt = t - self.now
        if dt > 0:
            for g, rates in self._rates().items():
                self.busy[g] += dt
                self.period_busy[g] += dt
                for j, r in rates.items():
                    j.shares[g] = max(0.0, j.shares[g] - r * dt)
        self.now = t

    def _progress_jobs(self) -> None:
        """Start device phases whose host phase ended, end iterations whose shares are done."""
        changed = True
        while changed:
            changed = False
            for j in list(self.running):
                if j.host_until is not None and j.host_until <= self.now + _EPS:
                    j.host_until = None
                    self._start_device_phase(j)
                    changed = True
                elif j.host_until is None and all(v <= _EPS for v in j.shares.values()):
                    self._end_iteration(j)
                    changed = True

    def _start_iteration(self, j: _Job) -> None:
        if j.next_ratio is not None:
            j.ratio, j.next_ratio = j.next_ratio, None
        j.iter_start = self.now
        j.shares = {}
        jitter = self.cfg.iteration_jitter
        j.scale = 1.0 + self.noise.uniform(-jitter, jitter) if jitter else 1.0
        host = (1.0 - j.u) * j.w * j.scale
        if host > _EPS:
            j.host_until = self.now + host
        else:
            j.host_until = None
            self._start_device_phase(j)

    def _start_device_phase(self, j: _Job) -> None:
        used = [g for g, r in enumerate(j.ratio) if r > 0]
        extra = self.cfg.split_overhead * j.u * j.w * (len(used) - 1)
        work = j.u * j.w * j.scale
        j.shares = {g: work * j.ratio[g] / RATIO_TOTAL + extra for g in used}

    def _end_iteration(self, j: _Job) -> None:
        took = self.now - j.iter_start
        j.recent.append(took)
        j.epoch_times.append(took)
        j.done_iters += 1
        j.shares = {}
        if j.done_iters >= j.total:
            j.finish = self.now
            self.running.remove(j)
            self._call_policy(None)  # a finished job leaves the manager's table
            return
        if j.done_iters % j.ipe == 0:
            mean_iter = statistics.fmean(j.epoch_times)
            j.epoch_times = []
            assert j.start is not None
            left = j.total - j.done_iters
            j.sd = (self.now - j.start + left * mean_iter) / j.solo_s
            self._call_policy(j)
        self._start_iteration(j)

    # ------------------------------------------------------------------------------------
    # The policy

    def _snapshot(self, ended: _Job | None) -> ClusterState:
        gpus = []
        for g in range(self.m):
            here = [j for j in self.running if g < len(j.ratio) and j.ratio[g] > 0]
            gpus.append(
                GpuState(
                    node=self.node_name,
                    index=g,
                    spec=self.gpu_spec,
                    mode=SharingMode.TIME_SLICING if here else None,
                    job_ids=tuple(j.spec.id for j in here),
                    committed_memory_mb=sum(j.spec.memory_need_mb() for j in here),
                    util_pct=self.util[g],
                )
            )
        free = self.cores - len(self.running)
        node = NodeState(self.node_name, NodeKind.GPU, self.cores, max(0, free), gpus=tuple(gpus))
        running = tuple(
            RunningJob(
                job=j.spec,
                placement=Placement(
                    j.spec.id,
                    self.node_name,
                    tuple(g for g, r in enumerate(j.ratio) if r > 0),
                    SharingMode.TIME_SLICING,
                ),
                started_s=j.start or 0.0,
                progress=j.done_iters / j.total,
                data_parallel=DataParallelState(j.ratio, j.sd, j.epoch, j is ended),
            )
            for j in self.running
        )
        return ClusterState(self.now, (node,), tuple(j.spec for j in self.pending), running)

    def _call_policy(self, ended: _Job | None) -> None:
        plan = self.policy.schedule(self._snapshot(ended), self.rng)
        for action in plan.actions:
            job = self.by_id.get(action.job_id)
            if action.kind != ActionKind.SET_DATA_RATIO or job is None or job not in self.running:
                self.ignored += 1
                continue
            new = check_ratio(tuple(action.value), self.m)
            old = job.next_ratio or job.ratio
            if new != old:
                job.next_ratio = new
                job.changes += 1
                self.ratio_log.append(
                    RatioChange(self.now, job.spec.id, job.epoch, old, new, action.explanation)
                )
        for d in plan.decisions:
            job = self.by_id.get(d.placement.job_id)
            if job is None or job not in self.pending:
                raise SimulationError(f"{self.policy_name} placed {d.placement.job_id!r} twice")
            if d.placement.node != self.node_name or not d.placement.gpu_indices:
                raise SimulationError(
                    f"{self.policy_name} placed {job.spec.id!r} off the node's GPUs"
                )
            weights = [1.0 if g in d.placement.gpu_indices else 0.0 for g in range(self.m)]
            job.ratio = largest_remainder(weights)
            self.pending.remove(job)
            self.running.append(job)
            job.start = self.now
            self._start_iteration(job)

    # ------------------------------------------------------------------------------------
    # Recording

    def _sample(self) -> None:
        sds = []
        for j in self.running:
            times = j.epoch_times or list(j.recent)
            if j.start is None or not times:
                continue
            left = j.total - j.done_iters
            sds.append((self.now - j.start + left * statistics.fmean(times)) / j.solo_s)
        if not sds:
            return
        self.samples.append(
            DpSample(
                self.now,
                len(sds),
                statistics.fmean(sds),
                min(sds),
                max(sds),
                max(sds) - min(sds),
                statistics.fmean(self.util),
            )
        )

    def _record(self, j: _Job) -> DpJobRecord:
        sd = None
        if j.finish is not None and j.start is not None:
            sd = (j.finish - j.start) / j.solo_s
        return DpJobRecord(
            j.spec.id, j.spec.name, j.solo_s, j.start, j.finish, sd, j.ratio, j.changes
        )


def simulate_data_parallel(
    cluster: ClusterSpec,
    jobs: Sequence[JobSpec],
    policy: Policy,
    *,
    interference: InterferenceModel | None = None,
    config: DpConfig | None = None,
) -> DpResult:
    """Run ``jobs`` under ``policy`` (see ``DataParallelSimulator``)."""
    return DataParallelSimulator(
        cluster, jobs, policy, interference=interference, config=config
    ).run()
