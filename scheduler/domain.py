"""Domain types of the scheduling core.

Plain, typed dataclasses shared by every policy, the simulator and (through an adapter) the
portal. Nothing here imports Django, Celery or Redis, reads a clock or does I/O.

Units: seconds (``*_s``), megabytes (``*_mb``), percent 0..100 (``*_pct``), GB/s (``*_gbps``),
GFLOPS (``*_gflops``). Optional profile metrics are ``None`` when unknown.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from scheduler.elastic_state import ElasticState
from scheduler.estimate import Estimate

#: Speed of a multi-GPU job spread over several nodes relative to the same job on one node,
#: for profiles without a measured unconsolidated time: 0.74, the median of the 165 ratios
#: ``throughput(unconsolidated) / throughput(consolidated)`` of Gavel's multi-GPU measurements
#: (``data/gavel/solo_throughput.csv``, scale factors 2, 4 and 8 on K80, P100 and V100; the
#: ratios range from 0.10 to 1.35 and depend on the model: V100 at 8 GPUs has a median of
#: 0.30). ``tests/scheduler/test_gangs.py`` recomputes it from the file.
UNCONSOLIDATED_SPEED = 0.74


#: ``JobSpec.sharing`` values besides a MIG profile name (docs/jobs.md): ``never`` (whole GPUs
#: of its own: nobody is packed beside it), ``allowed`` (the policy decides), ``mps`` /
#: ``time_slicing`` (packed only under that mode). Any other value names a MIG profile
#: (``1g.6gb``): packed only into an instance of that profile.
SHARING_NEVER = "never"
SHARING_ALLOWED = "allowed"
SHARING_CHOICES = (SHARING_NEVER, SHARING_ALLOWED, "mps", "time_slicing")


_MIG_NAME = re.compile(r"[1-9][0-9]?g\.[0-9]+gb(\+me)?")


def sharing_error(value: str) -> str | None:
    """Why ``value`` is no ``JobSpec.sharing`` value, or None."""
    if value in SHARING_CHOICES or _MIG_NAME.fullmatch(value):
        return None
    return (
        f"{value!r} is none of {', '.join(SHARING_CHOICES)} nor a MIG profile name such as 1g.6gb"
    )


class SharingMode(StrEnum):
    """How a GPU is shared (ALGORITHMS.md §4, Table 1)."""

    EXCLUSIVE = "exclusive"  # one job owns the GPU
    TIME_SLICING = "time_slicing"  # jobs share time; no memory isolation
    MPS = "mps"  # concurrent kernels with an active-thread percentage per job
    MIG = "mig"  # hardware-isolated instances with fixed profiles


class JobKind(StrEnum):
    DL_TRAIN = "dl-train"
    DL_INFER = "dl-infer"
    HPC = "hpc"
    OTHER = "other"


class NodeKind(StrEnum):
    CPU = "cpu"
    GPU = "gpu"


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A MIG instance profile, e.g. A30 ``1g.6gb``: 1 compute slice of 4, 6 GB."""

    name: str
    compute_slices: int
    memory_mb: int


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """A GPU model (the catalogue entry), not one physical device."""

    model: str
    architecture: str
    memory_mb: int
    sm_count: int
    dram_bw_gbps: float
    peak_gflops: float  # single precision
    sharing_modes: tuple[SharingMode, ...] = (SharingMode.EXCLUSIVE, SharingMode.TIME_SLICING)
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_total_slices: int = 0  # 7 on A100/H100, 4 on A30, 0 without MIG
    # MPS can cap each client's share of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE): Volta on.
    mps_thread_limit: bool = False

    def supports(self, mode: SharingMode) -> bool:
        return mode in self.sharing_modes

    def mig_profile(self, name: str | None) -> MigProfile | None:
        """The MIG instance profile called ``name`` on this model, or None."""
        for p in self.mig_profiles:
            if p.name == name:
                return p
        return None


@dataclass(frozen=True, slots=True)
class MemoryStep:
    """One memory phase of a job (ALGORITHMS.md §1 ``step_j``).

    The job enters this step at ``start_fraction`` (0..1) of its progress and its GPU memory
    grows from ``from_mb`` towards ``to_mb`` during the step (``to_mb`` is the step's peak).
    """

    start_fraction: float
    from_mb: float
    to_mb: float


@dataclass(frozen=True, slots=True)
class StallReasons:
    """Percent of stalls by reason (ALGORITHMS.md §3, Table 7)."""

    exec_dependency: float = 0.0
    instruction_fetch: float = 0.0
    memory_dependency: float = 0.0
    texture: float = 0.0
    synchronization: float = 0.0
    other: float = 0.0


@dataclass(frozen=True, slots=True)
class Profile:
    """An application profile: every metric of ALGORITHMS.md §1-§4, all optional but the name.

    ``gpu_time_s`` maps a GPU model name (catalogue key, e.g. ``"V100"``) to the solo run time
    on one such GPU (for a multi-GPU job: the solo run time with ``scale_factor`` GPUs of it on
    one node). ``gpu_time_unconsolidated_s`` maps a model to the solo run time of the same job
    spread over several nodes (a gang: slower where the gradients cross the network; Gavel
    measured it, the ``*_unconsolidated`` rows of its throughput table). Where it is missing,
    ``spread_time_s`` divides the consolidated time by a speed factor (``UNCONSOLIDATED_SPEED``
    unless the caller says otherwise).
    """

    name: str
    kind: JobKind = JobKind.OTHER
    cpu_time_s: float | None = None
    gpu_time_s: Mapping[str, float] = field(default_factory=dict)
    gpu_time_unconsolidated_s: Mapping[str, float] = field(default_factory=dict)
    gpu_memory_max_mb: float | None = None
    gpu_memory_avg_mb: float | None = None
    memory_steps: tuple[MemoryStep, ...] = ()
    # Utilisation and kernel metrics (§2, Table 1 of 003; §3)
    gpu_util_pct: float | None = None
    sm_efficiency_pct: float | None = None
    warp_efficiency_pct: float | None = None
    ipc: float | None = None
    occupancy_pct: float | None = None
    mem_util_pct: float | None = None
    h2d_gbps: float | None = None
    d2h_gbps: float | None = None
    gld_gbps: float | None = None
    gst_gbps: float | None = None
    dram_bw_gbps: float | None = None
    gflops: float | None = None
    stall: StallReasons | None = None
    epc: float | None = None
    registers_per_block: int | None = None
    smem_per_block_bytes: int | None = None
    l1_transactions: float | None = None
    saturation_tbs_per_sm: int | None = None
    # Job descriptors (§4)
    cm_ratio: float | None = None
    sensitivity: float | None = None
    batch_size: int | None = None
    image_size: int | None = None

    def solo_time_s(self, gpu_model: str | None) -> float | None:
        """Solo run time on ``gpu_model`` (None: on a CPU node), or None if not profiled."""
        if gpu_model is None:
            return self.cpu_time_s
        return self.gpu_time_s.get(gpu_model)

    def spread_time_s(
        self, gpu_model: str, speed: float = UNCONSOLIDATED_SPEED
    ) -> tuple[float | None, bool]:
        """(solo run time spread over several nodes of ``gpu_model``, measured?): the profiled
        unconsolidated time, else the consolidated time / ``speed`` (None if neither is known).
        """
        measured = self.gpu_time_unconsolidated_s.get(gpu_model)
        if measured is not None:
            return measured, True
        base = self.gpu_time_s.get(gpu_model)
        return (None if base is None else base / speed), False


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job as the scheduler sees it. ``gpus`` is the scale factor (0 = CPU-only job)."""

    id: str
    name: str = ""
    kind: JobKind = JobKind.OTHER
    arrival_s: float = 0.0
    gpus: int = 1
    gpu_memory_mb: float | None = None  # asked; falls back to the profile's max
    cpus: int = 1
    memory_mb: float = 0.0
    priority: int = 0  # higher runs first where a policy orders by priority
    profile: Profile | None = None
    # Who submitted it (portal user id); MPS serves one unix user per GPU at a time (§4).
    owner: str | None = None
    job_type: str | None = None  # key into measured interference tables (e.g. Gavel job_type)
    elastic_min: int | None = None
    elastic_max: int | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    # Elastic training (ALGORITHMS.md §6): the utility (a deadline in seconds after the start,
    # or what an hour sooner is worth) and the largest global batch the job accepts.
    elastic_deadline_s: float | None = None
    elastic_value_per_hour: float | None = None
    max_global_batch: int | None = None
    # The user's time limit (s, per attempt; ``scheduler.durations``): the node stops the job
    # when it runs longer. An upper bound of its run time that policies may use as an estimate.
    time_limit_s: float | None = None
    # The project (team) the job is accounted to: quotas and fair share (docs/projects.md).
    project: str | None = None
    # Observed, not predicted: the job types (``type_key``) this job was OOM-killed beside on a
    # shared GPU. Co-locating policies do not place it beside them again (framework), so a
    # pair that cannot co-run is not tried over and over.
    oom_with: frozenset[str] = frozenset()
    # It runs in a container image (docs/containers.md): only nodes with a container runtime
    # (``NodeState.container_runtimes``) may take it.
    container: bool = False
    # What the user allows (docs/jobs.md): ``sharing`` (``SHARING_CHOICES`` or a MIG profile
    # name); ``allow_cpu``: a GPU job may run on a CPU node where the policy finds it better
    # (the portal's ``device: auto``); False keeps it on GPUs. The defaults are the traces'
    # (their jobs are packed as their papers did); the portal's default is ``never``.
    sharing: str = SHARING_ALLOWED
    allow_cpu: bool = True
    # Whether a job whose GPU memory is unknown (neither asked nor profiled: its need counts as
    # 0 MB) may be packed. Traces: True (their co-location is decided by measured pair tables);
    # the portal: False, such a job is treated as needing a whole GPU.
    pack_unknown_memory: bool = True
    # Whether the profile's times are this job's length (its declared work). False: the job
    # did not say how long it runs, and the profile's times give only its relative speed per
    # GPU model (scaled to a nominal length). Policies that rank by length treat it as a job
    # of unknown length (``scheduler.gittins``); a job without a profile is one anyway.
    length_known: bool = True

    def length_unknown(self) -> bool:
        """Whether this GPU job's length is unknown to the scheduler: no profile, or a profile
        that gives only relative speeds (``length_known`` False)."""
        return self.gpus > 0 and (self.profile is None or not self.length_known)

    def memory_known(self) -> bool:
        """Whether the job's GPU memory need is known: asked, or its profile's max."""
        return self.gpu_memory_mb is not None or (
            self.profile is not None and self.profile.gpu_memory_max_mb is not None
        )

    def whole_gpu_reason(self) -> str | None:
        """Why this GPU job may not share a GPU (gets whole GPUs of its own), or None when it
        may be packed: it asked so, or its GPU memory is unknown and 0 MB is no ground to pack
        it (``pack_unknown_memory``)."""
        if self.sharing == SHARING_NEVER:
            return "it asks for GPUs of its own (sharing: never)"
        if not self.pack_unknown_memory and not self.memory_known():
            return (
                "its GPU memory is unknown (no profiled max, no gpu_memory_mb), so it is "
                "assumed to need a whole GPU"
            )
        return None

    def may_share(self) -> bool:
        """Whether this job may be packed beside others (``whole_gpu_reason``)."""
        return self.whole_gpu_reason() is None

    def type_key(self) -> str:
        """What makes two jobs interchangeable for pooling, scoring and ``oom_with``: the job
        type, else the profile name, else the job id."""
        if self.job_type:
            return self.job_type
        if self.profile is not None and self.profile.name:
            return self.profile.name
        return f"#{self.id}"

    def memory_need_mb(self) -> float:
        """GPU memory per GPU this job needs: asked, else profiled max, else 0."""
        if self.gpu_memory_mb is not None:
            return self.gpu_memory_mb
        if self.profile is not None and self.profile.gpu_memory_max_mb is not None:
            return self.profile.gpu_memory_max_mb
        return 0.0

    def solo_time_s(self, gpu_model: str | None) -> float | None:
        return None if self.profile is None else self.profile.solo_time_s(gpu_model)

    def run_time_s(
        self, gpu_model: str | None, *, spread: bool = False, speed: float = UNCONSOLIDATED_SPEED
    ) -> float | None:
        """Solo run time on ``gpu_model`` (None: CPU), on one node or ``spread`` over several
        (see ``Profile.spread_time_s``); None if the profile does not say."""
        if self.profile is None:
            return None
        if spread and gpu_model is not None:
            return self.profile.spread_time_s(gpu_model, speed)[0]
        return self.profile.solo_time_s(gpu_model)

    def work_estimate_s(self, gpu_model: str | None) -> float | None:
        """What a policy may take as this job's run time on ``gpu_model``: the profile's solo
        time there, else the user's time limit (an upper bound the user declared), else None."""
        solo = self.solo_time_s(gpu_model)
        return solo if solo is not None else self.time_limit_s


@dataclass(frozen=True, slots=True)
class PlacementPart:
    """One node's share of a gang placement: its GPUs and cores (see ``Placement.more``)."""

    node: str
    gpu_indices: tuple[int, ...] = ()
    cpus: int = 1


@dataclass(frozen=True, slots=True)
class Placement:
    """Where and how a job runs. ``gpu_indices`` empty means a CPU placement on ``node``.

    A **gang** (a job spread over several nodes, all or nothing) lists its first node in
    ``node`` / ``gpu_indices`` / ``cpus`` (node rank 0, where ``MASTER_ADDR`` points) and the
    other nodes in ``more``, in node-rank order. Every part has GPUs of one model and the same
    ``mode``; ``cpus`` is per node. Code that only knows single-node placements keeps working on
    the first part; gang-aware code iterates ``parts``.
    """

    job_id: str
    node: str
    gpu_indices: tuple[int, ...] = ()
    mode: SharingMode = SharingMode.EXCLUSIVE
    mps_percentage: int | None = None
    mig_profile: str | None = None
    cpus: int = 1
    more: tuple[PlacementPart, ...] = ()
    # MIG only: lay the GPU out as these instance profiles before starting the job (a
    # re-layout; instances in use must be kept). None: use a free instance already there.
    mig_layout: tuple[str, ...] | None = None

    @property
    def on_gpu(self) -> bool:
        return bool(self.gpu_indices)

    @property
    def is_gang(self) -> bool:
        """True when the job spans more than one node."""
        return bool(self.more)

    @property
    def parts(self) -> tuple[PlacementPart, ...]:
        """Every node's share, node rank 0 first."""
        return (PlacementPart(self.node, self.gpu_indices, self.cpus), *self.more)

    @property
    def nodes(self) -> tuple[str, ...]:
        """Node names in node-rank order."""
        return (self.node, *(p.node for p in self.more))

    @property
    def gpu_count(self) -> int:
        """GPUs over every node of the placement."""
        return len(self.gpu_indices) + sum(len(p.gpu_indices) for p in self.more)

    @property
    def gpu_keys(self) -> tuple[tuple[str, int], ...]:
        """``(node, gpu index)`` of every GPU, in rank order."""
        if not self.more:
            return tuple((self.node, i) for i in self.gpu_indices)
        return tuple((p.node, i) for p in self.parts for i in p.gpu_indices)


@dataclass(frozen=True, slots=True)
class GpuState:
    """One physical GPU in a snapshot: its spec, mode and what runs on it."""

    node: str
    index: int
    spec: GpuSpec
    mode: SharingMode | None = None  # None: idle, no mode fixed
    job_ids: tuple[str, ...] = ()
    committed_memory_mb: float = 0.0  # sum of the memory needs of the jobs placed on it
    used_memory_mb: float | None = None  # monitored (NVML / virtual), if known
    util_pct: float | None = None  # monitored, if known
    mig_slices_used: int = 0
    uuid: str = ""
    # MIG: the instances configured on the GPU now (profile names, free or in use); () = none.
    mig_layout: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, int]:
        return (self.node, self.index)

    @property
    def free_memory_mb(self) -> float:
        return self.spec.memory_mb - self.committed_memory_mb

    @property
    def idle(self) -> bool:
        return not self.job_ids


@dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    kind: NodeKind
    cores: int
    free_cores: int
    memory_mb: float = 0.0
    up: bool = True
    # Host memory (MB) not reserved by the jobs there; None: not tracked (no limit).
    free_memory_mb: float | None = None
    gpus: tuple[GpuState, ...] = ()
    # The container runtimes its agent reported (``podman``, ``apptainer``): container jobs go
    # only to nodes with one.
    container_runtimes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DataParallelState:
    """A data-parallel job's last epoch-end report (``slowdown_dr``, ALGORITHMS.md §5).

    ``ratio``: its data ratio, the share of each mini-batch per GPU of its node in tenths (one
    integer 0..10 per GPU index, summing to 10). ``slowdown``: SD_i at that epoch end (None:
    not known yet). ``epoch_ended``: it reported an epoch end the manager has not answered yet.
    """

    ratio: tuple[int, ...]
    slowdown: float | None = None
    epoch: int = 0
    epoch_ended: bool = False


@dataclass(frozen=True, slots=True)
class RunningJob:
    job: JobSpec
    placement: Placement
    started_s: float
    progress: float = 0.0  # 0..1 of its work, if known
    paused: bool = False
    # An elastic job's autoscaling memory (measured throughputs, straggler averages), if any.
    elastic: ElasticState | None = None
    # Data-parallel jobs that report through the training SDK (None: not reported).
    data_parallel: DataParallelState | None = None


@dataclass(frozen=True, slots=True)
class ProjectQuota:
    """A project's quota on one GPU model (docs/projects.md): ``guaranteed`` GPUs it gets
    whenever it asks (borrowed ones are reclaimed for it), and at most ``borrow_limit`` GPUs
    more while others leave them idle (None: no limit)."""

    project: str
    gpu_model: str
    guaranteed: int = 0
    borrow_limit: int | None = None


@dataclass(frozen=True, slots=True)
class Accounts:
    """Who may use what, and who used what: project quotas and the decayed usage fair share
    reads (``scheduler.fairshare``). ``usage`` maps ``(project, user)`` to decayed usage
    (GPU-seconds, halved every half-life); ``shares`` a project to its shares (missing: 1)."""

    quotas: tuple[ProjectQuota, ...] = ()
    usage: Mapping[tuple[str, str], float] = field(default_factory=dict)
    shares: Mapping[str, float] = field(default_factory=dict)


class KnowledgeView(Protocol):
    """What a policy may ask the cluster's knowledge (``scheduler.knowledge.Knowledge``, which
    the live loop and the simulator hand over as ``ClusterState.knowledge``): estimates only,
    never ``observe``. Seconds; a co-run speed is relative to running alone (1.0: no
    slowdown)."""

    #: The spread (standard deviation of the logarithm) of a declared length: how far a
    #: job's profile times may be off before anything is measured.
    prior_sigma: float

    def solo_time(
        self, job: JobSpec, gpu_model: str | None, *, spread: bool = False
    ) -> Estimate | None: ...

    def remaining_s(
        self, job: JobSpec, gpu_model: str | None, progress: float, *, spread: bool = False
    ) -> Estimate | None: ...

    def duration(self, job_type: str, owner: str | None = None) -> Estimate | None: ...

    def duration_samples(
        self, job_type: str, owner: str | None = None, *, at_least: int = 5
    ) -> tuple[tuple[float, ...], str, bool]: ...

    def co_run_speed(
        self,
        job: JobSpec,
        gpu_model: str,
        co_runners: Sequence[JobSpec],
        mode: SharingMode,
    ) -> Estimate | None: ...

    def co_run_possible(
        self,
        job: JobSpec,
        gpu_model: str,
        co_runners: Sequence[JobSpec],
        mode: SharingMode,
    ) -> bool: ...


@dataclass(frozen=True, slots=True)
class ClusterState:
    """One frozen snapshot handed to a policy. ``pending`` is in queue (submission) order."""

    now_s: float
    nodes: tuple[NodeState, ...]
    pending: tuple[JobSpec, ...]
    running: tuple[RunningJob, ...] = ()
    accounts: Accounts = field(default_factory=Accounts)
    # What the cluster has learned of jobs' speeds (``scheduler.knowledge.Knowledge``): the one
    # place a policy reads estimates from. None: profiles only (older callers, unit tests).
    knowledge: KnowledgeView | None = None
    # Job id -> the integral of the number of jobs present (queued, running or paused) from
    # the job's arrival to ``now_s`` (``scheduler.presence``): the history a finish-time-
    # fairness cap reads. The live loop fills it (its policy is built afresh each cycle);
    # None: a policy kept between calls counts it itself (the simulator).
    present_job_s: Mapping[str, float] | None = None
    # Job id -> seconds the job has held its placement so far, every attempt (its attained
    # service, for jobs of unknown length: ``scheduler.gittins``). The live loop reads it
    # from the attempt history, the simulator from its jobs (a view of its clock: read it
    # during the call). None: not known (a policy may count the current attempt of a running
    # job, ``now_s - started_s``).
    attained_s: Mapping[str, float] | None = None

    def node(self, name: str) -> NodeState:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class Decision:
    """A placement with the policy that chose it and a human-readable reason."""

    placement: Placement
    policy: str
    explanation: str
    score: float | None = None


class ActionKind(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    REQUEUE = "requeue"
    SET_DATA_RATIO = "set_data_ratio"
    SET_WORKERS = "set_workers"
    REPLACE_WORKERS = "replace_workers"  # value: the straggling ranks (elastic, §6)


@dataclass(frozen=True, slots=True)
class Action:
    """A change to a running job (pause, resume, data ratio, worker count) with its reason."""

    kind: ActionKind
    job_id: str
    policy: str
    explanation: str
    value: Any = None


@dataclass(frozen=True, slots=True)
class Plan:
    """What one scheduling cycle decided. Jobs in ``waiting`` stay queued, with a reason each."""

    decisions: tuple[Decision, ...] = ()
    actions: tuple[Action, ...] = ()
    waiting: Mapping[str, str] = field(default_factory=dict)
