"""The one protocol between the portal and its node agents (DESIGN.md, "Jobs, attempts and the
node protocol"; docs/reliability.md).

Both sides import this module and nothing of each other: it imports neither ``portal`` nor
Django, so the node agent holds no database credentials and speaks only these messages (Slurm's
slurmctld / slurmd split). Every message type is defined once, here, with its JSON form and its
validation.

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

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Protocol, TypeVar

from workers.profiles import profile_to_json as profile_payload  # noqa: F401  (part of the contract)

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

# Bounds of one message (a request larger than MAX_MESSAGE_BYTES is refused with HTTP 413).
MAX_MESSAGE_BYTES = 8 * 2**20
MAX_ITEMS = 10_000  # entries in any one list (samples, results, ...)
MAX_TEXT = 2**20  # characters of any one string (a command, a log tail)
MAX_NAME = 200  # characters of a node name, a metric name, a state
MAX_JSON_DEPTH = 64  # nesting of any JSON document read here (the messages need 6)

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


class ProtocolError(ValueError):
    """A message does not follow the protocol; the text names the offending field."""


class TransportError(RuntimeError):
    """A sync could not be completed (portal unreachable, HTTP error, bad reply)."""


def _agent_version(r: _Reader) -> int:
    """The version of an agent's message, if this portal accepts it (ProtocolError if not)."""
    version = int(r.int("version"))
    if version > PROTOCOL_VERSION:
        raise ProtocolError(
            f"version: this portal speaks protocol {OLDEST_AGENT_VERSION}-{PROTOCOL_VERSION} "
            f"and the agent {version}: upgrade the portal first (docs/upgrade.md)"
        )
    if version < OLDEST_AGENT_VERSION:
        raise ProtocolError(
            f"version: this portal accepts agents of protocol {OLDEST_AGENT_VERSION} and newer, "
            f"this agent speaks {version}: upgrade the agent (docs/upgrade.md)"
        )
    return version


def nudge_channel(node: str) -> str:
    """The Redis pub/sub channel on which the portal nudges ``node``'s agent to sync now."""
    return f"cosched:nudge:{node}"


# --- validation helpers ---------------------------------------------------------------------------

T = TypeVar("T")


class _Reader:
    """Typed, bounded access to one JSON object; errors name the field's path."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, Mapping):
            raise ProtocolError(f"{path or 'message'}: expected an object, got {_kind(data)}")
        self.data = data
        self.path = path

    def _where(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def _get(self, name: str, required: bool) -> Any:
        if name not in self.data or self.data[name] is None:
            if required:
                raise ProtocolError(f"{self._where(name)}: required")
            return None
        return self.data[name]

    def int(self, name: str, *, required: bool = True, minimum: int | None = None) -> Any:
        value = self._get(name, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"{self._where(name)}: expected an integer, got {_kind(value)}")
        if not -(2**63) <= value < 2**63:
            raise ProtocolError(f"{self._where(name)}: {value} is out of range")
        if minimum is not None and value < minimum:
            raise ProtocolError(f"{self._where(name)}: must be at least {minimum}, got {value}")
        return value

    def float(self, name: str, *, required: bool = True) -> Any:
        value = self._get(name, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProtocolError(f"{self._where(name)}: expected a number, got {_kind(value)}")
        if not math.isfinite(value):
            raise ProtocolError(f"{self._where(name)}: must be a finite number")
        return float(value)

    def bool(self, name: str, *, default: bool = False) -> bool:
        value = self._get(name, False)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ProtocolError(f"{self._where(name)}: expected true or false, got {_kind(value)}")
        return value

    def str(
        self, name: str, *, required: bool = True, limit: int = MAX_NAME, default: str = ""
    ) -> Any:
        value = self._get(name, required)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ProtocolError(f"{self._where(name)}: expected a string, got {_kind(value)}")
        if len(value) > limit:
            raise ProtocolError(f"{self._where(name)}: longer than {limit} characters")
        if "\x00" in value:
            raise ProtocolError(f"{self._where(name)}: contains a NUL character")
        return value

    def choice(self, name: str, choices: Iterable[str]) -> str:
        value = self.str(name)
        options = tuple(choices)
        if value not in options:
            allowed = ", ".join(options)
            raise ProtocolError(f"{self._where(name)}: {value!r} is not one of {allowed}")
        return str(value)

    def obj(self, name: str, *, required: bool = False) -> _Reader | None:
        value = self._get(name, required)
        return None if value is None else _Reader(value, self._where(name))

    def raw_obj(self, name: str) -> dict[str, Any] | None:
        """A free-form JSON object (a profile, GPU fields), size-checked."""
        value = self._get(name, False)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ProtocolError(f"{self._where(name)}: expected an object, got {_kind(value)}")
        return dict(value)

    def list(self, name: str, item: Callable[[Any, str], T]) -> list[T]:
        value = self._get(name, False)
        if value is None:
            return []
        if not isinstance(value, list):
            raise ProtocolError(f"{self._where(name)}: expected a list, got {_kind(value)}")
        if len(value) > MAX_ITEMS:
            raise ProtocolError(f"{self._where(name)}: more than {MAX_ITEMS} entries")
        return [item(v, f"{self._where(name)}[{i}]") for i, v in enumerate(value)]

    def str_map(self, name: str) -> dict[str, str]:
        value = self._get(name, False)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ProtocolError(f"{self._where(name)}: expected an object, got {_kind(value)}")
        out = {}
        for key, text in value.items():
            if not isinstance(text, str) or len(text) > MAX_TEXT or "\x00" in text:
                raise ProtocolError(f"{self._where(name)}.{key}: expected a string")
            if "\x00" in key or "=" in key or not key:
                raise ProtocolError(f"{self._where(name)}: bad variable name {key!r}")
            out[str(key)] = text
        return out


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(
        type(value), "a list" if isinstance(value, list) else "an object"
    )


def json_nesting_depth(text: str | bytes | bytearray) -> int:
    """The deepest nesting of ``[`` / ``{`` in a JSON document, read without parsing it (so a
    100,000-deep document is measured without recursion)."""
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8", "replace")
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


class JsonTooDeep(ValueError):
    """A JSON document nested deeper than its reader takes (``loads_bounded``)."""


def loads_bounded(
    data: bytes | bytearray | str, max_depth: int = MAX_JSON_DEPTH, *, finite: bool = True
) -> Any:
    """``json.loads`` of a document nested at most ``max_depth`` levels deep (and, with
    ``finite``, holding finite numbers only). Raises ``JsonTooDeep`` (naming the depth) before
    decoding a deeper one (Python's decoder would hit its recursion limit), ``ValueError`` for
    anything that is not JSON."""
    depth = json_nesting_depth(data)
    if depth > max_depth:
        raise JsonTooDeep(f"nested {depth} levels deep; at most {max_depth}")
    try:
        return json.loads(data, parse_constant=_no_constant if finite else None)
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise JsonTooDeep("nested too deeply") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (only finite numbers)")


def _parse(data: bytes | str | Mapping[str, Any]) -> Any:
    if isinstance(data, Mapping):
        return data
    if isinstance(data, bytes | bytearray) and len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message larger than {MAX_MESSAGE_BYTES} bytes")
    try:
        return loads_bounded(data, finite=False)  # a NaN is refused by the field it is in
    except JsonTooDeep as exc:
        raise ProtocolError(f"not a message: JSON {exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None


def _dump(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"), allow_nan=False)


def message_dict(message: Any) -> dict[str, Any]:
    """A message's JSON object: its dataclass fields by name, nested messages as their own
    objects (``Sample`` as its compact list), tuples as lists, mappings as objects. Reading
    back, with validation, is each message's own ``read`` / ``from_json``."""
    return {f.name: _plain(getattr(message, f.name)) for f in fields(message)}


def _plain(value: Any) -> Any:
    if isinstance(value, Sample):
        return value.to_list()
    if is_dataclass(value) and not isinstance(value, type):
        return message_dict(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


# --- messages -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class AttemptKey:
    """One attempt of one job: the id every message about it carries."""

    job_id: int
    attempt: int

    def __str__(self) -> str:
        return f"{self.job_id}.{self.attempt}"

    def to_dict(self) -> dict[str, Any]:
        return message_dict(self)

    @classmethod
    def read(cls, data: Any, path: str) -> AttemptKey:
        r = _Reader(data, path)
        return cls(r.int("job_id", minimum=1), r.int("attempt", minimum=1))


@dataclass(frozen=True, slots=True)
class GangPart:
    """One node's share of an attempt, in node-rank order (a single-node attempt has one).

    ``address`` is the node's address as its agent registered it (for ``MASTER_ADDR``)."""

    node: str
    node_rank: int
    gpu_indices: tuple[int, ...] = ()
    cpus: int = 1
    address: str = ""

    def to_dict(self) -> dict[str, Any]:
        return message_dict(self)

    @classmethod
    def read(cls, data: Any, path: str) -> GangPart:
        r = _Reader(data, path)
        return cls(
            node=r.str("node"),
            node_rank=r.int("node_rank", minimum=0),
            gpu_indices=tuple(r.list("gpu_indices", _read_index)),
            cpus=r.int("cpus", minimum=0),
            address=r.str("address", required=False),
        )


def _read_job_id(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**63:
        raise ProtocolError(f"{path}: expected a job id, got {value!r}")
    return value


def _read_port(value: int | None, path: str) -> int | None:
    if value is not None and not 1024 <= value <= 65535:
        raise ProtocolError(f"{path}.master_port: {value} is not a port from 1024 to 65535")
    return value


def _read_index(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 4096:
        raise ProtocolError(f"{path}: expected a GPU index, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class AttemptSpec:
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

    job_id: int
    attempt: int
    launch: bool
    paused: bool
    command: str
    parts: tuple[GangPart, ...]
    node_rank: int = 0
    mode: str = "exclusive"
    mps_percentage: int | None = None
    mig_profile: str | None = None
    gpu_model: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    profile: Mapping[str, Any] | None = None
    job_name: str = ""
    job_kind: str = "other"
    job_type: str | None = None
    gpu_memory_mb: float | None = None
    owner: str = ""  # the portal user; the node runs the job as their account (isolation)
    memory_mb: int | None = None  # the job's memory (per node), for its cgroup
    time_limit_s: float | None = None
    process_per_gpu: bool = False
    master_port: int | None = None  # MASTER_PORT of a multi-process attempt (chosen by the portal)
    # The image the job runs in (docs/containers.md); "" runs ``command`` on the node itself.
    container_image: str = ""

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

    def to_dict(self) -> dict[str, Any]:
        return message_dict(self)

    @classmethod
    def read(cls, data: Any, path: str) -> AttemptSpec:
        r = _Reader(data, path)
        parts = tuple(r.list("parts", GangPart.read))
        rank = r.int("node_rank", minimum=0)
        if not parts:
            raise ProtocolError(f"{path}.parts: an attempt has at least one part")
        if rank >= len(parts):
            raise ProtocolError(f"{path}.node_rank: {rank} but only {len(parts)} parts")
        if [p.node_rank for p in parts] != list(range(len(parts))):
            raise ProtocolError(f"{path}.parts: node ranks must be 0..{len(parts) - 1} in order")
        pct = r.int("mps_percentage", required=False)
        if pct is not None and not 1 <= pct <= 100:
            raise ProtocolError(f"{path}.mps_percentage: {pct} not in 1..100")
        limit = r.float("time_limit_s", required=False)
        if limit is not None and limit <= 0:
            raise ProtocolError(f"{path}.time_limit_s: must be positive, got {limit}")
        return cls(
            job_id=r.int("job_id", minimum=1),
            attempt=r.int("attempt", minimum=1),
            launch=r.bool("launch"),
            paused=r.bool("paused"),
            command=r.str("command", limit=MAX_TEXT),
            parts=parts,
            node_rank=rank,
            mode=r.choice("mode", ("exclusive", "time_slicing", "mps", "mig")),
            mps_percentage=pct,
            mig_profile=r.str("mig_profile", required=False) or None,
            gpu_model=r.str("gpu_model", required=False) or None,
            env=r.str_map("env"),
            profile=r.raw_obj("profile"),
            job_name=r.str("job_name", required=False, limit=MAX_TEXT),
            job_kind=r.str("job_kind", required=False, default="other"),
            job_type=r.str("job_type", required=False) or None,
            gpu_memory_mb=r.float("gpu_memory_mb", required=False),
            owner=r.str("owner", required=False, limit=150),
            memory_mb=r.int("memory_mb", required=False, minimum=1),
            time_limit_s=limit,
            process_per_gpu=r.bool("process_per_gpu"),
            master_port=_read_port(r.int("master_port", required=False), path),
            container_image=r.str("container_image", required=False, limit=300),
        )


@dataclass(frozen=True, slots=True)
class RunningAttempt:
    """An attempt whose processes the agent runs on this node, as it sees it now.

    ``pid``: the job's process (None while its runner is starting it); ``started_at``: when the
    agent started the attempt's runner (epoch s)."""

    job_id: int
    attempt: int
    state: str
    started_at: float
    pid: int | None = None

    @property
    def key(self) -> AttemptKey:
        return AttemptKey(self.job_id, self.attempt)

    def to_dict(self) -> dict[str, Any]:
        return message_dict(self)

    @classmethod
    def read(cls, data: Any, path: str) -> RunningAttempt:
        r = _Reader(data, path)
        return cls(
            job_id=r.int("job_id", minimum=1),
            attempt=r.int("attempt", minimum=1),
            state=r.choice("state", RUN_STATES),
            started_at=r.float("started_at"),
            pid=r.int("pid", required=False, minimum=1),
        )


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """How this node's part of an attempt ended (see ``OUTCOMES``). Kept on the agent's disk
    and sent with every request until the portal acknowledges it, so none is lost and none is
    recorded twice."""

    job_id: int
    attempt: int
    outcome: str
    ended_at: float
    exit_code: int | None = None
    detail: str = ""
    started_at: float | None = None
    log_tail: str | None = None

    @property
    def key(self) -> AttemptKey:
        return AttemptKey(self.job_id, self.attempt)

    @property
    def succeeded(self) -> bool:
        return self.outcome == "exited" and self.exit_code == 0

    def to_dict(self) -> dict[str, Any]:
        return message_dict(self)

    @classmethod
    def read(cls, data: Any, path: str) -> AttemptResult:
        r = _Reader(data, path)
        return cls(
            job_id=r.int("job_id", minimum=1),
            attempt=r.int("attempt", minimum=1),
            outcome=r.choice("outcome", OUTCOMES),
            ended_at=r.float("ended_at"),
            exit_code=r.int("exit_code", required=False),
            detail=r.str("detail", required=False, limit=MAX_TEXT),
            started_at=r.float("started_at", required=False),
            log_tail=r.str("log_tail", required=False, limit=MAX_TEXT) or None,
        )


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
class Sample:
    """One metric reading (names and units: ``portal.core.metrics``). ``gpu_index`` files it
    under one of this node's GPUs; ``job_id`` / ``attempt`` under a job it runs."""

    metric: str
    value: float
    at: float
    gpu_index: int | None = None
    job_id: int | None = None
    attempt: int | None = None

    def to_list(self) -> list[Any]:
        return [self.metric, self.value, self.at, self.gpu_index, self.job_id, self.attempt]

    @classmethod
    def read(cls, data: Any, path: str) -> Sample:
        if not isinstance(data, list) or len(data) != 6:
            raise ProtocolError(f"{path}: expected [metric, value, at, gpu, job, attempt]")
        names = ("metric", "value", "at", "gpu_index", "job_id", "attempt")
        r = _Reader(dict(zip(names, data, strict=True)), path)
        return cls(
            metric=r.str("metric"),
            value=r.float("value"),
            at=r.float("at"),
            gpu_index=r.int("gpu_index", required=False, minimum=0),
            job_id=r.int("job_id", required=False, minimum=1),
            attempt=r.int("attempt", required=False, minimum=1),
        )


@dataclass(frozen=True, slots=True)
class LogTail:
    """The last part of a running attempt's log (stdout and stderr), for the job page."""

    job_id: int
    attempt: int
    text: str

    def to_dict(self) -> dict[str, Any]:
        return message_dict(self)

    @classmethod
    def read(cls, data: Any, path: str) -> LogTail:
        r = _Reader(data, path)
        return cls(
            r.int("job_id", minimum=1),
            r.int("attempt", minimum=1),
            r.str("text", limit=MAX_TEXT, required=False),
        )


@dataclass(frozen=True, slots=True)
class LogChunk:
    """A piece of an attempt's full log (docs/job-control.md): ``offset`` is the byte offset
    in the node's log file where ``text`` begins and ``size`` its length there in bytes (the
    text is decoded, bytes that are not UTF-8 replaced); the portal keeps every chunk, in
    order, once."""

    job_id: int
    attempt: int
    offset: int
    text: str
    size: int

    def to_dict(self) -> dict[str, Any]:
        return message_dict(self)

    @classmethod
    def read(cls, data: Any, path: str) -> LogChunk:
        r = _Reader(data, path)
        return cls(
            r.int("job_id", minimum=1),
            r.int("attempt", minimum=1),
            r.int("offset", minimum=0),
            r.str("text", limit=MAX_TEXT),
            r.int("size", minimum=0),
        )


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a node is, as its agent sees it (registration). ``gpus``: one object per device
    with ``index`` and the ``Gpu`` row fields (``uuid``, ``model``, ``architecture``,
    ``memory_mb``, ``sm_count``, ``sharing_modes``, ``mig_profiles``). ``isolation``: how the
    node keeps jobs apart, one object per aspect (``what``: ``ISOLATION_ASPECTS``; ``level``:
    ``ISOLATION_LEVELS``; ``text``: the agent's description, ``workers.isolation``); empty from
    an agent that does not say. ``container_runtimes``: the container runtimes the node runs
    jobs' images with (``CONTAINER_RUNTIMES``; ``workers.containers``)."""

    kind: str
    cores: int
    memory_mb: int
    backend: str
    gpus: tuple[Mapping[str, Any], ...] = ()
    address: str = ""
    isolation: tuple[Mapping[str, str], ...] = ()
    container_runtimes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return message_dict(self)

    @classmethod
    def read(cls, data: Any, path: str) -> NodeInfo:
        r = _Reader(data, path)

        def gpu(value: Any, where: str) -> Mapping[str, Any]:
            g = _Reader(value, where)
            g.int("index", minimum=0)
            g.str("model")
            g.int("memory_mb", minimum=0)
            return dict(value)

        def aspect(value: Any, where: str) -> Mapping[str, str]:
            a = _Reader(value, where)
            return {
                "what": a.choice("what", ISOLATION_ASPECTS),
                "level": a.choice("level", ISOLATION_LEVELS),
                "text": a.str("text", limit=4000),
            }

        def runtime(value: Any, where: str) -> str:
            if value not in CONTAINER_RUNTIMES:
                raise ProtocolError(f"{where}: one of {', '.join(CONTAINER_RUNTIMES)}")
            return str(value)

        return cls(
            kind=r.choice("kind", ("gpu", "cpu")),
            cores=r.int("cores", minimum=1),
            memory_mb=r.int("memory_mb", minimum=0),
            backend=r.choice("backend", ("virtual", "nvml")),
            gpus=tuple(r.list("gpus", gpu)),
            address=r.str("address", required=False),
            isolation=tuple(r.list("isolation", aspect)),
            container_runtimes=tuple(r.list("container_runtimes", runtime)),
        )


@dataclass(frozen=True, slots=True)
class SyncRequest:
    """Agent -> portal, every ``SyncReply.sync_interval_s`` and whenever nudged.

    ``instance`` is random per agent process (the portal notes restarts); ``seq`` orders the
    node's requests (see the module docstring); ``running`` lists every attempt the agent runs,
    ``results`` every ended one not yet acknowledged; ``info`` is sent by a new process and
    whenever the portal asks (``SyncReply.send_info``). ``checkpoints``: now and then, the jobs
    whose checkpoint directory the node keeps and of which it runs no attempt (the portal says
    which may go: ``SyncReply.drop_checkpoints``)."""

    node: str
    instance: str
    seq: int
    sent_at: float
    running: tuple[RunningAttempt, ...] = ()
    results: tuple[AttemptResult, ...] = ()
    samples: tuple[Sample, ...] = ()
    log_tails: tuple[LogTail, ...] = ()
    log_chunks: tuple[LogChunk, ...] = ()
    info: NodeInfo | None = None
    checkpoints: tuple[int, ...] = ()
    version: int = PROTOCOL_VERSION

    def to_json(self) -> str:
        return _dump(message_dict(self))

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> SyncRequest:
        r = _Reader(_parse(data), "")
        version = _agent_version(r)
        info = r.obj("info")
        return cls(
            version=version,
            node=r.str("node"),
            instance=r.str("instance"),
            seq=r.int("seq", minimum=1),
            sent_at=r.float("sent_at"),
            info=None if info is None else NodeInfo.read(info.data, "info"),
            running=tuple(r.list("running", RunningAttempt.read)),
            results=tuple(r.list("results", AttemptResult.read)),
            samples=tuple(r.list("samples", Sample.read)),
            log_tails=tuple(r.list("log_tails", LogTail.read)),
            log_chunks=tuple(r.list("log_chunks", LogChunk.read)),
            checkpoints=tuple(r.list("checkpoints", _read_job_id)),
        )


@dataclass(frozen=True, slots=True)
class SyncReply:
    """Portal -> agent.

    ``lease_s``: the node may run its attempts for this long after it *sent* the request; when
    it cannot renew in time its runners stop them (``lease_kill_grace_s`` between SIGTERM and
    SIGKILL). ``acked``: results recorded (the agent may forget them). ``desired``: every
    attempt this node should run now; nothing else. ``send_info``: the portal does not know this
    node (yet): sync again with ``info``; nothing else in the reply counts then.
    ``stop_grace_s``: between SIGTERM and SIGKILL when the agent stops an attempt that is not
    desired any more (preempted, requeued, cancelled) and when one runs past its time limit, so
    the job can checkpoint. ``drop_checkpoints``: of the request's ``checkpoints``, the jobs
    whose checkpoint directory may be deleted (ended long enough ago, or unknown).
    """

    node: str
    lease_s: float
    lease_kill_grace_s: float
    sync_interval_s: float
    acked: tuple[AttemptKey, ...] = ()
    desired: tuple[AttemptSpec, ...] = ()
    send_info: bool = False
    resync_from: int | None = None
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    drop_checkpoints: tuple[int, ...] = ()
    version: int = PROTOCOL_VERSION

    @property
    def applied(self) -> bool:
        """Did the portal apply the request (False: ``send_info`` or ``resync_from``)?"""
        return not self.send_info and self.resync_from is None

    def to_json(self) -> str:
        return _dump(message_dict(self))

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> SyncReply:
        r = _Reader(_parse(data), "")
        version = r.int("version")
        if version != PROTOCOL_VERSION:
            raise ProtocolError(f"version: this agent speaks {PROTOCOL_VERSION}, got {version}")
        lease = r.float("lease_s")
        if lease <= 0:
            raise ProtocolError("lease_s: must be positive")
        grace = r.float("stop_grace_s", required=False)  # absent from older portals
        return cls(
            version=version,
            node=r.str("node"),
            lease_s=lease,
            lease_kill_grace_s=max(0.0, r.float("lease_kill_grace_s")),
            sync_interval_s=max(0.05, r.float("sync_interval_s")),
            acked=tuple(r.list("acked", AttemptKey.read)),
            desired=tuple(r.list("desired", AttemptSpec.read)),
            send_info=r.bool("send_info"),
            resync_from=r.int("resync_from", required=False, minimum=1),
            stop_grace_s=max(0.0, grace if grace is not None else DEFAULT_STOP_GRACE_S),
            drop_checkpoints=tuple(r.list("drop_checkpoints", _read_job_id)),
        )


@dataclass(frozen=True, slots=True)
class ResultReport:
    """Runner -> portal, only when the agent does not collect a finished attempt in time (it is
    frozen, dead or cut off): the results alone, recorded exactly once like a sync's. It renews
    no lease and lists nothing, so the portal infers nothing from what it lacks and any order
    with the node's syncs is fine. Answered by ``ResultAck``."""

    node: str
    results: tuple[AttemptResult, ...]
    version: int = PROTOCOL_VERSION

    def to_json(self) -> str:
        return _dump(message_dict(self))

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> ResultReport:
        r = _Reader(_parse(data), "")
        version = r.int("version")
        if version != PROTOCOL_VERSION:
            raise ProtocolError(f"version: this portal speaks {PROTOCOL_VERSION}, got {version}")
        results = tuple(r.list("results", AttemptResult.read))
        if not results:
            raise ProtocolError("results: give at least one")
        return cls(node=r.str("node"), results=results, version=version)


@dataclass(frozen=True, slots=True)
class ResultAck:
    """Portal -> runner: the results recorded (now or before)."""

    acked: tuple[AttemptKey, ...]
    version: int = PROTOCOL_VERSION

    def to_json(self) -> str:
        return _dump(message_dict(self))

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> ResultAck:
        r = _Reader(_parse(data), "")
        return cls(acked=tuple(r.list("acked", AttemptKey.read)), version=r.int("version"))


class Transport(Protocol):
    """How an agent reaches the portal: over HTTP (``workers.agent.HttpTransport``) or, in the
    embedded default, in-process (``portal.core.agent_sync.InProcessTransport``). Same messages
    either way. Raises ``TransportError`` when the exchange failed."""

    def sync(self, request: SyncRequest) -> SyncReply: ...
