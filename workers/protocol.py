"""The one protocol between the portal and its node agents (DESIGN.md, "Jobs, attempts and the
node protocol"; docs/reliability.md).

Both sides import this module and nothing of each other: it imports neither ``portal`` nor
Django, so the node agent holds no database credentials and speaks only these messages (Slurm's
slurmctld / slurmd split). Every message type is defined once, here, as a field table: each
field's JSON kind, default and checks; one codec (``workers.wire``) writes and reads them all.

**One exchange, desired state.** The agent sends a ``SyncRequest`` every second or so (and at
once when nudged); the portal answers with a ``SyncReply``:

- the request renews the node's **lease**, lists *every* attempt the agent runs
  (``RunningAttempt``) and the results of attempts that ended (``AttemptResult``, kept on the
  agent's disk until acknowledged), plus metric samples and log tails; the first request of an
  agent process carries ``NodeInfo`` (registration);
- the reply gives the lease (seconds, counted by the agent from when it *sent* the request, so
  the agent's deadline always falls before the portal's), the acknowledged results, and the
  **desired attempts** of this node (``AttemptSpec``): everything needed to launch one, whether it
  may be launched (never started) and whether it should be paused.

The agent starts desired attempts it does not run (once: an attempt it ever started stays on its
disk until its result is acknowledged), kills running attempts that are not desired any more
(cancelled, requeued, superseded), and applies pause / resume. A message about an old attempt is
recognised by its ``(job_id, attempt)`` and acknowledged without effect on the job.

**Order.** Requests carry ``seq``, increasing across the agent's restarts (its state directory
keeps it). The portal applies a node's requests only in increasing ``seq`` order and refuses an
older one (``SyncReply.resync_from``), so a request delayed in the network can never undo what
a newer one said. With one agent per node (it locks its state directory) and replies acted on
before the next request, an attempt offered to a node and absent from a later request of that
node is known not to run there.

**Results from a runner.** A runner whose finished attempt its agent does not collect in time
(the agent frozen, dead or cut off) sends the result itself (``ResultReport``, same token): a
fact recorded exactly once, in any order with the node's syncs. So a job that finished while its
agent was away is not run again when the node's lease runs out (Slurm's slurmstepd reports step
completion to the controller the same way).

**Versions.** Every message carries ``version``. A portal accepts agents of its own protocol
version and of the one before (``OLDEST_AGENT_VERSION``) and answers each in the version it
spoke, so a rolling upgrade (portal first, then the agents node by node) never stops a node.

**Nudges** (``nudge_channel``) carry no content: they only make an agent sync now, so a forged one
does nothing but cost a request.

Units: seconds (``*_s``; ``*_at`` are seconds since the epoch), MB, percent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from workers.profiles import profile_to_json as profile_payload  # noqa: F401  (part of the contract)
from workers.wire import (
    MAX_ITEMS,  # noqa: F401  (re-exported: part of the contract)
    MAX_JSON_DEPTH,  # noqa: F401  (re-exported: part of the contract)
    MAX_MESSAGE_BYTES,  # noqa: F401  (re-exported: part of the contract)
    MAX_NAME,  # noqa: F401  (re-exported: part of the contract)
    MAX_TEXT,
    AnyObject,
    Choice,
    Environment,
    Flag,
    Float,
    Id,
    Int,
    JsonTooDeep,  # noqa: F401  (re-exported: part of the contract)
    ListOf,
    Message,
    Nested,
    OneOf,
    ProtocolError,
    Record,
    Text,
    encode,
    json_nesting_depth,  # noqa: F401  (re-exported: part of the contract)
    loads_bounded,  # noqa: F401  (re-exported: part of the contract)
    wire,
)

#: The protocol this code speaks. Version 2 (2026-11): agents report which protocol they
#: speak on every request and the portal answers in the agent's version; fields added since
#: version 1 are optional both ways (readers ignore keys they do not know).
PROTOCOL_VERSION = 2
#: The oldest agent protocol a portal accepts: one version older, so agents can be upgraded one
#: node at a time after the portal (docs/upgrade.md). An older agent is refused with a message
#: saying to upgrade it.
OLDEST_AGENT_VERSION = PROTOCOL_VERSION - 1
SYNC_PATH = "/agent/v1/sync"  # the portal's HTTP endpoint (POST, JSON)
RESULTS_PATH = "/agent/v1/results"  # where a runner reports its result when its agent cannot
AUTH_SCHEME = "Bearer"  # Authorization: Bearer <node token>
NODE_TOKEN_PREFIX = "cosn_"


# What an agent reports about an attempt it runs.
RUN_STATES = ("starting", "running", "paused", "stopping")
# How an attempt's processes ended, from the agent's side (``AttemptResult.outcome``):
#   exited         the job's process exited by itself (``exit_code``; negative: by that signal)
#   killed         the agent stopped it because it was no longer desired (``detail`` says why)
#   stopped        the agent stopped it because the agent itself was shutting down
#   lease_expired  the node's lease ran out without renewal: the runner stopped it
#   launch_failed  it could not start (no such command, bad placement, ...)
#   lost           the agent lost track of it (its runner vanished); its processes were killed
#   time_limit     it ran past its time limit (``AttemptSpec.time_limit_s``): the runner
#                  stopped it (SIGTERM, then SIGKILL after the grace)
# NodeInfo.isolation: the aspects a node reports (which account runs a job, its core and memory
# limits, the GPU device nodes it may open) and how well each is held.
ISOLATION_ASPECTS = {"accounts": "accounts", "limits": "limits", "gpu_devices": "GPU devices"}
ISOLATION_LEVELS = ("ok", "weak", "n/a")
# Container runtimes a node may report (workers.containers.RUNTIMES).
CONTAINER_RUNTIMES = ("podman", "apptainer")
OUTCOMES = ("exited", "killed", "stopped", "lease_expired", "launch_failed", "lost", "time_limit")
#: SIGTERM, then SIGKILL after this many seconds, when the agent stops an attempt that is no
#: longer desired (preempted, requeued, cancelled) or over its time limit; the portal's
#: ``COSCHED_STOP_GRACE_S`` overrides it (``SyncReply.stop_grace_s``).
DEFAULT_STOP_GRACE_S = 10.0


class TransportError(RuntimeError):
    """A sync could not be completed (portal unreachable, HTTP error, bad reply)."""


def nudge_channel(node: str) -> str:
    """The Redis pub/sub channel on which the portal nudges ``node``'s agent to sync now."""
    return f"cosched:nudge:{node}"


# --- checks beyond a field's kind (``wire(check=...)``) ----------------------------------------


def _at(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _agent_version(version: int, where: str) -> int:
    """The version of an agent's message, if this portal accepts it (ProtocolError if not)."""
    if version > PROTOCOL_VERSION:
        raise ProtocolError(
            f"{where}: this portal speaks protocol {OLDEST_AGENT_VERSION}-{PROTOCOL_VERSION} "
            f"and the agent {version}: upgrade the portal first (docs/upgrade.md)"
        )
    if version < OLDEST_AGENT_VERSION:
        raise ProtocolError(
            f"{where}: this portal accepts agents of protocol {OLDEST_AGENT_VERSION} and newer, "
            f"this agent speaks {version}: upgrade the agent (docs/upgrade.md)"
        )
    return version


def _speaks(side: str) -> Callable[[int, str], int]:
    """A version check: only this ``side``'s own protocol version."""

    def check(version: int, where: str) -> int:
        if version != PROTOCOL_VERSION:
            raise ProtocolError(f"{where}: this {side} speaks {PROTOCOL_VERSION}, got {version}")
        return version

    return check


def _port(value: int | None, where: str) -> int | None:
    if value is not None and not 1024 <= value <= 65535:
        raise ProtocolError(f"{where}: {value} is not a port from 1024 to 65535")
    return value


def _percentage(value: int | None, where: str) -> int | None:
    if value is not None and not 1 <= value <= 100:
        raise ProtocolError(f"{where}: {value} not in 1..100")
    return value


def _positive(value: float | None, where: str) -> float | None:
    if value is not None and value <= 0:
        raise ProtocolError(f"{where}: must be positive, got {value}")
    return value


def _lease(value: float, where: str) -> float:
    if value <= 0:
        raise ProtocolError(f"{where}: must be positive")
    return value


def _not_empty(value: tuple[Any, ...], where: str) -> tuple[Any, ...]:
    if not value:
        raise ProtocolError(f"{where}: give at least one")
    return value


JOB_ID = Id(1, 2**63, "job id")
GPU_INDEX = Id(0, 4096, "GPU index")


# --- messages -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class AttemptKey(Message):
    """One attempt of one job: the id every message about it carries."""

    job_id: int = wire(Int(minimum=1))
    attempt: int = wire(Int(minimum=1))

    def __str__(self) -> str:
        return f"{self.job_id}.{self.attempt}"


@dataclass(frozen=True, slots=True)
class GangPart(Message):
    """One node's share of an attempt, in node-rank order (a single-node attempt has one).

    ``address`` is the node's address as its agent registered it (for ``MASTER_ADDR``)."""

    node: str = wire(Text())
    node_rank: int = wire(Int(minimum=0))
    gpu_indices: tuple[int, ...] = wire(ListOf(GPU_INDEX), ())
    cpus: int = wire(Int(minimum=0), 1, required=True)
    address: str = wire(Text(), "")


@dataclass(frozen=True, slots=True)
class AttemptSpec(Message):
    """A desired attempt on the receiving node, with everything needed to launch it.

    ``launch``: no agent has started this node's part yet, so the agent may start it (once).
    False means it was started: keep it running if you run it; never start it again.
    ``paused``: the job is PAUSED: its processes should be stopped (SIGSTOP), else running.
    ``env``: variables the portal adds to the job's environment (after the agent's own).
    ``profile``: the application profile in the JSON form of ``workers.profiles``, or None.
    ``parts``: every node of the attempt in node-rank order; ``node_rank`` is the receiver's.
    ``time_limit_s``: the job's time limit for this attempt (running time, pauses excluded);
    past it the runner stops the job and the result's outcome is ``time_limit``.
    ``process_per_gpu``: start one process (a data-parallel rank) per GPU of the part instead
    of one per node; every rank gets its own ``RANK`` / ``LOCAL_RANK`` and GPU, and
    ``WORLD_SIZE`` counts the GPUs of every part (``rank_envs``). Elastic jobs run this way.
    """

    job_id: int = wire(Int(minimum=1))
    attempt: int = wire(Int(minimum=1))
    launch: bool = wire(Flag())
    paused: bool = wire(Flag())
    command: str = wire(Text(MAX_TEXT))
    parts: tuple[GangPart, ...] = wire(ListOf(Nested(GangPart)), first=True)
    node_rank: int = wire(Int(minimum=0), 0, required=True, first=True)
    mode: str = wire(
        Choice(("exclusive", "time_slicing", "mps", "mig")), "exclusive", required=True
    )
    mps_percentage: int | None = wire(Int(), None, check=_percentage)
    mig_profile: str | None = wire(Text(blank_as_none=True), None)
    gpu_model: str | None = wire(Text(blank_as_none=True), None)
    env: Mapping[str, str] = wire(Environment(), factory=dict)
    profile: Mapping[str, Any] | None = wire(AnyObject(), None)
    job_name: str = wire(Text(MAX_TEXT), "")
    job_kind: str = wire(Text(), "other")
    job_type: str | None = wire(Text(blank_as_none=True), None)
    gpu_memory_mb: float | None = wire(Float(), None)
    # the portal user; the node runs the job as their account (isolation)
    owner: str = wire(Text(150), "")
    memory_mb: int | None = wire(
        Int(minimum=1), None
    )  # the job's memory (per node), for its cgroup
    time_limit_s: float | None = wire(Float(), None, check=_positive)
    process_per_gpu: bool = wire(Flag(), False)
    # MASTER_PORT of a multi-process attempt (chosen by the portal)
    master_port: int | None = wire(Int(), None, check=_port)
    # The image the job runs in (docs/containers.md); "" runs ``command`` on the node itself.
    container_image: str = wire(Text(300), "")

    @property
    def key(self) -> AttemptKey:
        return AttemptKey(self.job_id, self.attempt)

    @property
    def world_size(self) -> int:
        """Processes of the whole attempt: one per GPU (``process_per_gpu``), else per node."""
        if self.process_per_gpu:
            return sum(max(1, len(p.gpu_indices)) for p in self.parts)
        return len(self.parts)

    @property
    def first_rank(self) -> int:
        """The global rank of the receiving node's first process."""
        if not self.process_per_gpu:
            return self.node_rank
        return sum(max(1, len(p.gpu_indices)) for p in self.parts[: self.node_rank])

    @property
    def part(self) -> GangPart:
        """The receiving node's part."""
        return self.parts[self.node_rank]

    @property
    def is_gang(self) -> bool:
        return len(self.parts) > 1

    def _check(self, path: str) -> None:
        parts, rank = self.parts, self.node_rank
        if not parts:
            raise ProtocolError(f"{_at(path, 'parts')}: an attempt has at least one part")
        if rank >= len(parts):
            raise ProtocolError(f"{_at(path, 'node_rank')}: {rank} but only {len(parts)} parts")
        if [p.node_rank for p in parts] != list(range(len(parts))):
            raise ProtocolError(
                f"{_at(path, 'parts')}: node ranks must be 0..{len(parts) - 1} in order"
            )


@dataclass(frozen=True, slots=True)
class RunningAttempt(Message):
    """An attempt whose processes the agent runs on this node, as it sees it now.

    ``pid``: the job's process (None while its runner is starting it); ``started_at``: when the
    agent started the attempt's runner (epoch s)."""

    job_id: int = wire(Int(minimum=1))
    attempt: int = wire(Int(minimum=1))
    state: str = wire(Choice(RUN_STATES))
    started_at: float = wire(Float())
    pid: int | None = wire(Int(minimum=1), None)

    @property
    def key(self) -> AttemptKey:
        return AttemptKey(self.job_id, self.attempt)


@dataclass(frozen=True, slots=True)
class AttemptResult(Message):
    """How this node's part of an attempt ended (see ``OUTCOMES``). Kept on the agent's disk
    and sent with every request until the portal acknowledges it, so none is lost and none is
    recorded twice."""

    job_id: int = wire(Int(minimum=1))
    attempt: int = wire(Int(minimum=1))
    outcome: str = wire(Choice(OUTCOMES))
    ended_at: float = wire(Float())
    exit_code: int | None = wire(Int(), None)
    detail: str = wire(Text(MAX_TEXT), "")
    started_at: float | None = wire(Float(), None)
    log_tail: str | None = wire(Text(MAX_TEXT, blank_as_none=True), None)

    @property
    def key(self) -> AttemptKey:
        return AttemptKey(self.job_id, self.attempt)

    @property
    def succeeded(self) -> bool:
        return self.outcome == "exited" and self.exit_code == 0


#: Per-attempt GPU readings (``Sample`` with ``gpu_index``, ``job_id`` and ``attempt``): the GPU
#: memory (MB) and SM utilisation (percent) of the attempt's own processes on that GPU, from
#: NVML's per-process figures (``workers.gpu.attribution``).
JOB_GPU_MEMORY = "job_gpu_memory_mb"
JOB_GPU_UTIL = "job_gpu_util_pct"
#: Per-attempt progress figures: ``progress`` (0..1 of the declared work) and ``steps``
#: (iterations done, where the job counts them).
JOB_PROGRESS = "progress"
JOB_STEPS = "steps"


@dataclass(frozen=True, slots=True)
class Sample(Message):
    """One metric reading (names and units: ``portal.core.metrics``). ``gpu_index`` files it
    under one of this node's GPUs; ``job_id`` / ``attempt`` under a job it runs. Travels as a
    list (there are many)."""

    list_form: ClassVar[str] = "[metric, value, at, gpu, job, attempt]"

    metric: str = wire(Text())
    value: float = wire(Float())
    at: float = wire(Float())
    gpu_index: int | None = wire(Int(minimum=0), None)
    job_id: int | None = wire(Int(minimum=1), None)
    attempt: int | None = wire(Int(minimum=1), None)

    def to_list(self) -> list[Any]:
        return encode(self)


@dataclass(frozen=True, slots=True)
class LogTail(Message):
    """The last part of a running attempt's log (stdout and stderr), for the job page."""

    job_id: int = wire(Int(minimum=1))
    attempt: int = wire(Int(minimum=1))
    text: str = wire(Text(MAX_TEXT), required=False)


@dataclass(frozen=True, slots=True)
class LogChunk(Message):
    """A piece of an attempt's full log (docs/job-control.md): ``offset`` is the byte offset
    in the node's log file where ``text`` begins and ``size`` its length there in bytes (the
    text is decoded, bytes that are not UTF-8 replaced); the portal keeps every chunk, in
    order, once."""

    job_id: int = wire(Int(minimum=1))
    attempt: int = wire(Int(minimum=1))
    offset: int = wire(Int(minimum=0))
    text: str = wire(Text(MAX_TEXT))
    size: int = wire(Int(minimum=0))


# NodeInfo.gpus: one object per device; these keys are checked, all are kept.
_GPU = Record({"index": Int(minimum=0), "model": Text(), "memory_mb": Int(minimum=0)}, True)
# NodeInfo.isolation: one object per aspect, exactly these keys.
_ASPECT = Record(
    {
        "what": Choice(tuple(ISOLATION_ASPECTS)),
        "level": Choice(ISOLATION_LEVELS),
        "text": Text(4000),
    }
)


@dataclass(frozen=True, slots=True)
class NodeInfo(Message):
    """What a node is, as its agent sees it (registration). ``gpus``: one object per device
    with ``index`` and the ``Gpu`` row fields (``uuid``, ``model``, ``architecture``,
    ``memory_mb``, ``sm_count``, ``sharing_modes``, ``mig_profiles``). ``isolation``: how the
    node keeps jobs apart, one object per aspect (``what``: ``ISOLATION_ASPECTS``; ``level``:
    ``ISOLATION_LEVELS``; ``text``: the agent's description, ``workers.isolation``); empty from
    an agent that does not say. ``container_runtimes``: the container runtimes the node runs
    jobs' images with (``CONTAINER_RUNTIMES``; ``workers.containers``)."""

    kind: str = wire(Choice(("gpu", "cpu")))
    cores: int = wire(Int(minimum=1))
    memory_mb: int = wire(Int(minimum=0))
    backend: str = wire(Choice(("virtual", "nvml")))
    gpus: tuple[Mapping[str, Any], ...] = wire(ListOf(_GPU), ())
    address: str = wire(Text(), "")
    isolation: tuple[Mapping[str, str], ...] = wire(ListOf(_ASPECT), ())
    container_runtimes: tuple[str, ...] = wire(ListOf(OneOf(CONTAINER_RUNTIMES)), ())


@dataclass(frozen=True, slots=True)
class SyncRequest(Message):
    """Agent -> portal, every ``SyncReply.sync_interval_s`` and whenever nudged.

    ``instance`` is random per agent process (the portal notes restarts); ``seq`` orders the
    node's requests (see the module docstring); ``running`` lists every attempt the agent runs,
    ``results`` every ended one not yet acknowledged; ``info`` is sent by a new process and
    whenever the portal asks (``SyncReply.send_info``). ``checkpoints``: now and then, the jobs
    whose checkpoint directory the node keeps and of which it runs no attempt (the portal says
    which may go: ``SyncReply.drop_checkpoints``)."""

    node: str = wire(Text())
    instance: str = wire(Text())
    seq: int = wire(Int(minimum=1))
    sent_at: float = wire(Float())
    running: tuple[RunningAttempt, ...] = wire(ListOf(Nested(RunningAttempt)), ())
    results: tuple[AttemptResult, ...] = wire(ListOf(Nested(AttemptResult)), ())
    samples: tuple[Sample, ...] = wire(ListOf(Nested(Sample)), ())
    log_tails: tuple[LogTail, ...] = wire(ListOf(Nested(LogTail)), ())
    log_chunks: tuple[LogChunk, ...] = wire(ListOf(Nested(LogChunk)), ())
    info: NodeInfo | None = wire(Nested(NodeInfo), None)
    checkpoints: tuple[int, ...] = wire(ListOf(JOB_ID), ())
    version: int = wire(Int(), PROTOCOL_VERSION, required=True, check=_agent_version, first=True)


@dataclass(frozen=True, slots=True)
class SyncReply(Message):
    """Portal -> agent.

    ``lease_s``: the node may run its attempts for this long after it *sent* the request; when
    it cannot renew in time its runners stop them (``lease_kill_grace_s`` between SIGTERM and
    SIGKILL). ``acked``: results recorded (the agent may forget them). ``desired``: every
    attempt this node should run now; nothing else. ``send_info``: the portal does not know this
    node (yet): sync again with ``info``; nothing else in the reply counts then.
    ``stop_grace_s``: between SIGTERM and SIGKILL when the agent stops an attempt that is not
    desired any more (preempted, requeued, cancelled) and when one runs past its time limit, so
    the job can checkpoint (absent from older portals: the default). ``drop_checkpoints``: of
    the request's ``checkpoints``, the jobs whose checkpoint directory may be deleted (ended
    long enough ago, or unknown).
    """

    node: str = wire(Text())
    lease_s: float = wire(Float(), check=_lease)
    lease_kill_grace_s: float = wire(Float(floor=0.0))
    sync_interval_s: float = wire(Float(floor=0.05))
    acked: tuple[AttemptKey, ...] = wire(ListOf(Nested(AttemptKey)), ())
    desired: tuple[AttemptSpec, ...] = wire(ListOf(Nested(AttemptSpec)), ())
    send_info: bool = wire(Flag(), False)
    resync_from: int | None = wire(Int(minimum=1), None)
    stop_grace_s: float = wire(Float(floor=0.0), DEFAULT_STOP_GRACE_S)
    drop_checkpoints: tuple[int, ...] = wire(ListOf(JOB_ID), ())
    version: int = wire(Int(), PROTOCOL_VERSION, required=True, check=_speaks("agent"), first=True)

    @property
    def applied(self) -> bool:
        """Did the portal apply the request (False: ``send_info`` or ``resync_from``)?"""
        return not self.send_info and self.resync_from is None


@dataclass(frozen=True, slots=True)
class ResultReport(Message):
    """Runner -> portal, only when the agent does not collect a finished attempt in time (it is
    frozen, dead or cut off): the results alone, recorded exactly once like a sync's. It renews
    no lease and lists nothing, so the portal infers nothing from what it lacks and any order
    with the node's syncs is fine. Answered by ``ResultAck``."""

    node: str = wire(Text())
    results: tuple[AttemptResult, ...] = wire(ListOf(Nested(AttemptResult)), check=_not_empty)
    version: int = wire(Int(), PROTOCOL_VERSION, required=True, check=_speaks("portal"), first=True)


@dataclass(frozen=True, slots=True)
class ResultAck(Message):
    """Portal -> runner: the results recorded (now or before)."""

    acked: tuple[AttemptKey, ...] = wire(ListOf(Nested(AttemptKey)))
    version: int = wire(Int(), PROTOCOL_VERSION, required=True, first=True)


class Transport(Protocol):
    """How an agent reaches the portal: over HTTP (``workers.agent.HttpTransport``) or, in the
    embedded default, in-process (``portal.core.agent_sync.InProcessTransport``). Same messages
    either way. Raises ``TransportError`` when the exchange failed."""

    def sync(self, request: SyncRequest) -> SyncReply: ...
