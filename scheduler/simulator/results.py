"""Settings, errors and result records of the discrete-event simulator."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from scheduler.domain import UNCONSOLIDATED_SPEED
from scheduler.simulator.elastic import ElasticModel

if TYPE_CHECKING:  # pandas is only needed by the frame helpers
    import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints (no pandas-stubs)


class SimulationError(RuntimeError):
    """The simulation cannot go on (a bug in a policy or an inconsistent input)."""


class PolicyDecisionError(SimulationError):
    """A policy returned an impossible plan: double-booked GPU, memory or MIG slices
    over-committed, a job placed twice, an unknown node... The message names the policy and
    the job."""

    def __init__(self, policy: str, job_id: str, message: str) -> None:
        self.policy = policy
        self.job_id = job_id
        super().__init__(f"policy {policy!r}, job {job_id!r}: {message}")


class OomAction(StrEnum):
    """What happens to the job whose memory growth caused an out-of-memory on its GPU."""

    FAIL = "fail"  # the job ends with reason ``failed-oom``
    REQUEUE = "requeue"  # the job restarts from scratch: back to the queue, progress 0


class EndReason(StrEnum):
    COMPLETED = "completed"
    FAILED_OOM = "failed-oom"
    REJECTED = "rejected"  # can never run on the cluster (scheduler.admission), at its arrival
    UNSCHEDULABLE = "unschedulable"  # still queued when nothing else could happen
    UNFINISHED = "unfinished"  # running (or paused) when the run stopped (horizon, stall)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Simulator settings (docs/simulator.md, "Execution model").

    - ``seed``: seeds the ``random.Random`` handed to the policy (same seed, same result).
    - ``context_switch_overhead``: fraction; with ``n > 1`` jobs time-sliced on a GPU each
      runs at ``1 / (n * (1 + overhead))`` of its solo speed (times the interference part).
    - ``oom_action``: fail or requeue the job that grew past its GPU's memory;
      ``max_oom_restarts``: after that many OOM requeues the job fails.
    - ``reschedule_interval_s``: also call the policy every so many seconds (None: only on
      arrivals, completions and failures).
    - ``mig_speed_exponent``: a MIG instance with ``s`` of ``S`` compute slices runs a job at
      ``(s / S) ** exponent`` of its whole-GPU solo speed (1.0: linear in slices). The
      ``sharing`` interference model replaces this with the job's sensitivity.
    - ``mig_relayout_s``: seconds a job waits when its MIG instance must be created first (a
      new instance, or a re-layout the placement asks for; ``scheduler.simulator.sharing``).
    - ``requeue_keeps_progress``: a job a policy requeues (REQUEUE action) resumes where it
      stopped (checkpointed); an OOM restart always starts over.
    - ``snapshot_progress_step``: ``RunningJob.progress`` in snapshots is refreshed when the
      job state changes or its progress moved by this much (live progress is sampled too).
    - ``sample_interval_s``: period of the Slow-Down samples (None: about 400 over the run).
    - ``max_time_s``: stop the simulation at this time (None: run until nothing can happen).
    - ``max_idle_ticks``: with periodic rescheduling, when nothing runs and nothing is left to
      arrive, ticks go on until the policy has changed nothing this many calls in a row.
    - ``unconsolidated_speed``: a job spread over several nodes (a gang) whose profile has no
      unconsolidated time runs at this fraction of its one-node speed (default 0.74, the median
      of Gavel's measured unconsolidated / consolidated throughputs; ``scheduler.domain``).
    - ``elastic_model``: how elastic data-parallel jobs run on measured curves
      (``scheduler.simulator.elastic.ElasticModel``: warm-up, regroup, windows, faults; None:
      its defaults). Jobs that declare a worker range and whose job type has a measured curve
      on their GPU model honour ``SET_WORKERS`` / ``REPLACE_WORKERS``.
    - ``preemption_cost_s``: a job a policy requeued (preempted or migrated) makes no progress
      for this many seconds after it is placed again (checkpoint and restart); 0 is Gavel's
      assumption. ``preemption_cost_by_type`` overrides it per ``JobSpec.job_type``.
    - ``estimate_noise``: sigma of the lognormal factor on every job's declared work
      (``scheduler.estimates``; seeded by ``seed``); the engine keeps the true work to itself.
    - ``pair_noise``: sigma of the lognormal noise on the pair prior the knowledge starts from
      (the simulator's own interference model, per GPU model, job type and co-runner types;
      0: the exact table, an oracle). Measured co-run windows refine it once a pair has run.
    - ``hide_lengths``: the share of jobs (drawn by ``seed``) that declare no length
      (``scheduler.estimates.with_hidden_lengths``): their profiles keep only their relative
      speed per GPU model, at a nominal length, ``JobSpec.length_known`` is False, and they
      report no progress (the knowledge sees only their completions).
    - ``round_s``: policies are consulted only every so many seconds, from t = 0 (Gavel's
      rounds); arrivals, completions and failures wait for the next round. None: on events.
    - ``learn``: hand policies a ``scheduler.knowledge.Knowledge`` fed with what a live
      cluster would observe (progress windows of running jobs alone or beside co-runner
      types, completions); ``observe_every_s``: running jobs report their window at least this
      often (the live progress reports), besides every change of speed or co-location.
    """

    seed: int = 0
    context_switch_overhead: float = 0.05
    oom_action: OomAction = OomAction.REQUEUE
    max_oom_restarts: int = 3
    reschedule_interval_s: float | None = None
    mig_speed_exponent: float = 1.0
    mig_relayout_s: float = 10.0
    requeue_keeps_progress: bool = True
    snapshot_progress_step: float = 0.01
    sample_interval_s: float | None = None
    max_time_s: float | None = None
    max_idle_ticks: int = 10
    unconsolidated_speed: float = UNCONSOLIDATED_SPEED
    preemption_cost_s: float = 0.0
    preemption_cost_by_type: Mapping[str, float] = field(default_factory=dict)
    elastic_model: ElasticModel | None = None
    estimate_noise: float = 0.0
    pair_noise: float = 0.0
    hide_lengths: float = 0.0
    round_s: float | None = None
    learn: bool = True
    observe_every_s: float = 300.0

    def preemption_cost(self, job_type: str | None) -> float:
        """Seconds without progress after a requeued job of ``job_type`` restarts."""
        if job_type is not None and job_type in self.preemption_cost_by_type:
            return float(self.preemption_cost_by_type[job_type])
        return self.preemption_cost_s

    def __post_init__(self) -> None:
        if not 0 <= self.preemption_cost_s <= 1e9 or any(
            not 0 <= v <= 1e9 for v in self.preemption_cost_by_type.values()
        ):
            raise ValueError("preemption_cost_s must be in [0, 1e9] seconds")
        for name, v in (("estimate_noise", self.estimate_noise), ("pair_noise", self.pair_noise)):
            if not 0 <= v <= 10:
                raise ValueError(f"{name} must be in [0, 10], got {v!r}")
        if not 0 <= self.hide_lengths <= 1:
            raise ValueError(f"hide_lengths must be in [0, 1], got {self.hide_lengths!r}")
        if self.round_s is not None and not 0 < self.round_s <= 1e7:
            raise ValueError(f"round_s must be in (0, 1e7] seconds, got {self.round_s!r}")
        if not 0 < self.observe_every_s <= 1e9:
            raise ValueError(f"observe_every_s must be > 0, got {self.observe_every_s!r}")
        if not 0 < self.unconsolidated_speed <= 10:
            raise ValueError(
                f"unconsolidated_speed must be in (0, 10], got {self.unconsolidated_speed!r}"
            )


@dataclass(frozen=True, slots=True)
class JobRecord:
    """How one job went. Times in seconds since the trace origin; None where it never happened.

    ``solo_s``: solo run time on the GPU model (or CPU) of its last placement, on one node
    (a gang's spread penalty shows in its Slow-Down). ``end_s``: when it ended for any reason
    (``finish_s`` only for completed jobs). ``slowdown``: (finish - first start) / solo_s
    (ALGORITHMS §5 at completion). ``speedup``: its inverse (solo / co-run time, 0..1).
    ``location``: ``node/gpu,gpu`` or ``node/cpu``; a gang's nodes joined by ``+``
    (``v100-0/0,1,2,3+v100-1/0,1,2,3``); ``nodes``: how many nodes it ran on (0: never ran).
    """

    job_id: str
    name: str
    job_type: str | None
    gpus: int
    arrival_s: float
    start_s: float | None
    finish_s: float | None
    end_s: float | None
    end_reason: str
    location: str
    nodes: int
    gpu_model: str | None
    mode: str | None
    solo_s: float | None
    jct_s: float | None
    queue_s: float | None
    run_s: float | None
    slowdown: float | None
    speedup: float | None
    oom_count: int
    restarts: int
    preemptions: int
    paused_s: float
    explanation: str


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """Cluster state from ``t_s`` until the next point. ``busy_gpus``: GPUs running at least
    one unpaused job (a MIG GPU counts the fraction of its slices in use)."""

    t_s: float
    busy_gpus: float
    queued: int
    running: int
    paused: int


@dataclass(frozen=True, slots=True)
class SlowdownSample:
    """Slow-Down (ALGORITHMS §5) of the running jobs at ``t_s``: count, mean, min, max and
    ``max_diff`` = max - min (SD_max_diff)."""

    t_s: float
    running: int
    mean: float
    min: float
    max: float
    max_diff: float


@dataclass(frozen=True, slots=True)
class ElasticEvent:
    """One elastic change of a running job (``scheduler.simulator.engine``): ``kind`` is
    ``set_workers`` / ``replace_workers`` (accepted: warm-up or regroup starts), ``applied``
    (the new group trains), or ``skipped set_workers`` / ``skipped replace_workers`` (not
    possible now: no idle GPU or spare, a change under way, no measured curve)."""

    t_s: float
    job_id: str
    kind: str
    workers_from: int
    workers_to: int
    text: str


@dataclass(slots=True)
class SimResult:
    """Everything one simulation produced."""

    policy: str
    gpu_count: int
    jobs: list[JobRecord]
    timeline: list[TimelinePoint]
    slowdown_samples: list[SlowdownSample]
    decision_latency_s: list[float]
    oom_count: int
    events: int
    policy_calls: int
    wall_s: float
    ignored_actions: int = 0
    config: SimConfig = field(default_factory=SimConfig)
    # GPU-seconds each job held GPUs (warming and regrouping GPUs included).
    gpu_seconds: Mapping[str, float] = field(default_factory=dict)
    elastic_events: list[ElasticEvent] = field(default_factory=list)

    def jobs_frame(self) -> pd.DataFrame:
        """One row per job (the JobRecord fields) plus a ``policy`` column."""
        import pandas as pd

        frame = pd.DataFrame(_rows(self.jobs, _JOB_COLUMNS), columns=_JOB_COLUMNS)
        frame.insert(0, "policy", self.policy)
        return frame

    def timeline_frame(self) -> pd.DataFrame:
        import pandas as pd

        frame = pd.DataFrame(_rows(self.timeline, _TIMELINE_COLUMNS), columns=_TIMELINE_COLUMNS)
        frame.insert(0, "policy", self.policy)
        return frame

    def slowdown_frame(self) -> pd.DataFrame:
        import pandas as pd

        frame = pd.DataFrame(
            _rows(self.slowdown_samples, _SLOWDOWN_COLUMNS), columns=_SLOWDOWN_COLUMNS
        )
        frame.insert(0, "policy", self.policy)
        return frame


_JOB_COLUMNS = list(JobRecord.__dataclass_fields__)
_TIMELINE_COLUMNS = list(TimelinePoint.__dataclass_fields__)
_SLOWDOWN_COLUMNS = list(SlowdownSample.__dataclass_fields__)


def _rows(records: Sequence[object], columns: Sequence[str]) -> list[list[object]]:
    """The records' fields as plain rows. Every field is a scalar, so this equals
    ``dataclasses.asdict`` per record, which copies recursively and was most of the time a
    10,000-job report took to build its frames."""
    return [[getattr(r, c) for c in columns] for r in records]
