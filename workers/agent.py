"""The node agent: runs the attempts the portal wants on one node (DESIGN.md, Node agent;
docs/reliability.md).

    python -m workers.agent --name gpu-1 --portal https://cosched.example.org \\
        --token-file /etc/cosched/gpu-1.token --backend nvml [--nudge-url redis://host:6379/0]

It speaks only ``workers.protocol`` (no Django, no database credentials). One loop:

1. **collect**: runners that ended have written ``result.json``; those become results in the
   agent's outbox (they stay on disk until the portal acknowledges them);
2. **sync** (``Transport.sync``): report the attempts it runs, the results, the attempts it was
   told run here but does not know, metric samples and log tails; the reply renews the lease
   (written to the lease file its runners read) and lists the desired attempts;
3. **reconcile**: start every desired attempt it may launch and does not run (each under a
   ``workers.runner`` process in its own session, the job's parent), stop every attempt it runs
   that is not desired any more (cancelled, requeued, superseded), SIGSTOP / SIGCONT the ones
   whose pause flag changed. After a launch it syncs again at once, so the job is RUNNING in the
   database a few milliseconds after the process started.

It loops every ``--interval`` seconds (default: the portal's ``COSCHED_SYNC_INTERVAL_S``), at
once when the portal nudges it (Redis pub/sub, ``--nudge-url``; optional: without nudges it is
only slower) and when a runner says its job ended (a byte into ``wake.fifo``). Metric samples
are taken every ``--sample-every`` seconds in between and ride on the next periodic sync.

A runner whose result the agent does not collect in time (the agent frozen or dead) reports it
to the portal itself with the node's token file (``workers.runner``), so a job that finished
meanwhile is not run again when the node's lease runs out.

**Local state** (``<data>/agent/<node>/``, mode 0700, locked by the one agent using it):
``lease.json``, ``seq.json`` (the order of its requests), ``wake.fifo`` and one directory per
attempt (``attempts/<job>-<attempt>/``, see ``workers.runner``). On start the agent re-adopts
the runners still alive, turns the finished ones into results, kills the job processes of a
runner that died without a result, and kills every other process carrying its marker
(``COSCHED_AGENT_ID``). The next sync reports all that; the portal replies which attempts are
still desired, and the others are stopped.

**Lease**: a reply's lease counts from when the request was *sent*; the runners stop their jobs
when it runs out (agent dead, frozen, or cut off from the portal). Stopping the agent (SIGTERM)
leaves the jobs running: an upgrade must not kill hours of training; a new agent adopts them.

The embedded default (``manage.py run_embedded``) runs ``NodeAgent`` objects in-process with
``portal.core.agent_sync.InProcessTransport``: the same messages, no HTTP.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import http.client
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scheduler.catalog import UnknownGpuModel, gpu_spec
from scheduler.domain import JobKind, Placement, Profile, SharingMode
from workers import containers
from workers import runner as runner_files
from workers.gpu.attribution import AttemptProcesses, attribute
from workers.gpu.base import DeviceInfo, GpuBackend, GpuBackendError
from workers.isolation import GpuDevices, IsolationError, JobUsers, Limits, node_isolation
from workers.launcher import LaunchError, build_env, is_portal_variable, new_reports, tail
from workers.profiles import ProfileFormatError, profile_from_json, profiles_document
from workers.protocol import (
    AUTH_SCHEME,
    DEFAULT_STOP_GRACE_S,
    JOB_GPU_MEMORY,
    JOB_GPU_UTIL,
    OUTCOMES,
    PROTOCOL_VERSION,
    RESULTS_PATH,
    SYNC_PATH,
    AttemptKey,
    AttemptResult,
    AttemptSpec,
    LogChunk,
    LogTail,
    NodeInfo,
    ProtocolError,
    RunningAttempt,
    Sample,
    SyncReply,
    SyncRequest,
    Transport,
    TransportError,
    nudge_channel,
)
from workers.slowdown import live_slowdown

log = logging.getLogger(__name__)

LOG_TAIL_BYTES = 16 * 1024  # what the agent sends for the job page's live log
# The full log goes to the portal in chunks of at most this many bytes (docs/job-control.md):
# one per running attempt and periodic sync, up to LOG_CHUNKS_PER_SYNC of an ended one.
LOG_CHUNK_BYTES = 256 * 1024
LOG_CHUNKS_PER_SYNC = 4
KILL_GRACE_S = DEFAULT_STOP_GRACE_S  # SIGTERM, then SIGKILL (until the portal says otherwise)
CHECKPOINT_DIR_ENV = "COSCHED_CHECKPOINT_DIR"  # the job's directory kept across its attempts
TIME_LIMIT_ENV = "COSCHED_TIME_LIMIT_S"  # the attempt's time limit (s), when it has one
MAX_BUFFERED_SAMPLES = 20_000  # kept while the portal cannot be reached (oldest dropped)
FOLLOW_UP_SYNCS = 4  # at most this many syncs in one step (after launches and stops)
MARKER_ENV = "COSCHED_AGENT_ID"  # in every runner's and job's environment
ATTEMPT_DIR_ENV = "COSCHED_ATTEMPT_DIR"  # in every runner's environment
ROOT = Path(__file__).resolve().parents[1]


def device_row(device: DeviceInfo) -> dict[str, Any]:
    """The ``Gpu`` row fields (``portal.core.nodes.node_register``) of one backend device."""
    row: dict[str, Any] = {
        "index": device.index,
        "uuid": device.uuid,
        "model": device.model or device.name,
        "memory_mb": int(device.memory_total_mb),
        "sm_count": device.sm_count or 0,
    }
    try:
        spec = gpu_spec(device.model or device.name)
    except (UnknownGpuModel, KeyError):
        # Registered all the same, for exclusive use only: no sharing modes or MIG profiles are
        # known for it. Say so, since the scheduler then never packs jobs there.
        log.warning(
            "GPU %s (%s) is not in the GPU catalogue (scheduler/catalog.py): it is offered for "
            "exclusive use only; add the model to share it",
            device.index,
            device.model or device.name,
        )
        return row
    row.update(
        architecture=spec.architecture,
        sm_count=device.sm_count or spec.sm_count,
        sharing_modes=[m.value for m in spec.sharing_modes],
        mig_profiles=[
            {"name": p.name, "slices": p.compute_slices, "memory_mb": p.memory_mb}
            for p in spec.mig_profiles
        ],
    )
    return row


def _utf8_boundary(data: bytes) -> int:
    """The length of ``data`` without a UTF-8 character cut at its end."""
    start = len(data) - 1
    while start > 0 and len(data) - start < 4 and (data[start] & 0xC0) == 0x80:
        start -= 1
    lead = data[start]
    need = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return len(data) if start + need <= len(data) else (start or len(data))


def read_log_chunks(
    job_id: int, attempt: int, path: Path, start: int, count: int
) -> list[LogChunk]:
    """Up to ``count`` chunks of ``path`` from byte ``start`` on, each ending at a line end
    when it has one (else at a character boundary), so no chunk splits a UTF-8 character."""
    out: list[LogChunk] = []
    try:
        with open(path, "rb") as f:
            f.seek(start)
            for _ in range(count):
                data = f.read(LOG_CHUNK_BYTES)
                if not data:
                    break
                cut = len(data)
                if len(data) == LOG_CHUNK_BYTES:
                    newline = data.rfind(b"\n")
                    cut = newline + 1 if newline >= 0 else _utf8_boundary(data)
                text = data[:cut].decode("utf-8", "replace")
                out.append(LogChunk(job_id, attempt, start, text, cut))
                start += cut
                f.seek(start)
    except OSError:
        return out
    return out


@dataclass
class _Attempt:
    """One attempt this agent started (or adopted): its directory, processes and what it
    reports."""

    spec: AttemptSpec
    dir: Path
    log_path: Path
    started_at: float  # epoch s, when the runner was started
    log_offset: int = 0  # bytes of the log already read for reports
    runner: subprocess.Popen[bytes] | None = None  # when this process started the runner
    runner_pid: int | None = None
    runner_ticks: int | None = None
    job_pid: int | None = None
    job_ticks: int | None = None
    job_pgids: tuple[int, ...] = ()  # every process group of the job (one per rank)
    paused: bool = False  # what was applied (SIGSTOP) to the job's group
    stopping: bool = False
    result: AttemptResult | None = None  # set once the runner recorded how it ended
    attached: bool = False  # to the virtual backend
    profile: Profile | None = None
    mig_uuid: str | None = None
    tail_size: int = -1  # log size when its tail was last sent
    log_sent: int = -1  # bytes of the log the portal has in full (-1: from log_offset on)
    sending_tail_size: int = -1  # log size when the tail in the request in flight was read
    progress: float | None = None
    iters_done: int | None = None
    iters_total: int | None = None
    iter_time_s: float | None = None
    active_s: float | None = None
    run_s: float | None = None  # the emulator's own solo run time (scaled), when it says
    resumed_from: float = 0.0  # fraction of the work done by earlier attempts (a checkpoint)
    pidfd: int | None = field(default=None, repr=False)

    @property
    def key(self) -> AttemptKey:
        return self.spec.key

    @property
    def job_id(self) -> int:
        return self.spec.job_id

    def solo_time_s(self) -> float | None:
        """Solo run time (s) for ALGORITHMS.md §5: what the job says it needs alone (the
        emulator's ``run_s``), else the profile's time on this GPU model (or CPU time); for an
        attempt that resumed from a checkpoint, the share of it still to do."""
        if self.run_s:
            solo: float | None = float(self.run_s)
        elif self.profile is None:
            return None
        elif self.spec.part.gpu_indices:
            solo = self.profile.gpu_time_s.get(self.spec.gpu_model or "")
        else:
            solo = self.profile.cpu_time_s
        if solo is not None and 0.0 < self.resumed_from < 1.0:
            # A resumed attempt has only the rest of the work to do: its Slow-Down is measured
            # against that share (else it would read below 1).
            solo *= 1.0 - self.resumed_from
        return solo


class NodeAgent:
    """The agent of node ``name``; see the module docstring. Thread safety: ``step`` and
    ``shutdown`` take one lock; ``nudge`` may be called from any thread."""

    def __init__(
        self,
        name: str,
        backend: GpuBackend | None,
        transport: Transport,
        *,
        kind: str = "gpu",
        cores: int = 8,
        memory_mb: int = 32768,
        backend_name: str = "virtual",
        data_dir: Path | None = None,
        log_dir: Path | None = None,
        work_dir: Path | None = None,
        state_dir: Path | None = None,
        mps_pipe_dir: Path | None = None,
        mps_log_dir: Path | None = None,
        address: str | None = None,
        sample_every_s: float = 2.0,
        job_users: JobUsers | None = None,
        limits: Limits | None = None,
        checkpoint_root: Path | None = None,
        gpu_devices: GpuDevices | None = None,
        gpu_device_dir: Path | None = None,
        container_runtimes: Sequence[str] | None = None,
        containers_conf: Path | None = None,
        container_network: str | None = None,
    ) -> None:
        """``backend`` None: a node without GPUs (``kind`` "cpu"). Directories default to
        ``<data>/logs``, ``<data>/work`` and ``<data>/agent/<name>`` (``data_dir``: the
        parent of ``log_dir`` when given, else ``$COSCHED_DATA_DIR``, else ``./var``). MPS
        directories: the agent's own ``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY``
        (NVIDIA's defaults without them) on ``nvml``, ``<data>/mps/<name>/...`` on ``virtual``.
        ``job_users``: which unix account runs whose job (default: every job as this process's
        own account); ``limits``: how cores and memory are limited (default: detected at
        ``start``; ``workers.isolation``); ``gpu_devices``: whether each job's process is kept
        from the device nodes of the GPUs it was not given (default: detected at ``start``
        for the nodes in ``gpu_device_dir``, see ``gpu_devices_for``).

        ``checkpoint_root``: each job's ``COSCHED_CHECKPOINT_DIR`` is ``<root>/job-<id>``
        (default ``$COSCHED_CHECKPOINT_ROOT``, else ``<data>/checkpoints``); a job resumes on
        another node only if that node sees the same directory (shared storage).

        Containers (docs/containers.md, ``workers.containers``): ``container_runtimes`` the
        runtimes this node runs jobs' images with (default: ``$COSCHED_CONTAINER_RUNTIMES``,
        else those installed); ``containers_conf`` the ``containers.conf`` Podman is run with
        (``CONTAINERS_CONF``; default ``$COSCHED_CONTAINERS_CONF``, else one the agent writes in
        its state directory: runtime runc, no default ulimits, cgroupfs); ``container_network``
        the network a container gets (default ``$COSCHED_CONTAINER_NETWORK``, else ``none``)."""
        self.name = name
        self.backend = backend
        self.transport = transport
        self.kind = kind
        self.cores = cores
        self.memory_mb = memory_mb
        self.backend_name = backend_name
        if data_dir is None:
            if log_dir is not None:
                data_dir = Path(log_dir).parent
            else:
                data_dir = Path(os.environ.get("COSCHED_DATA_DIR") or "var")
        data_dir = Path(data_dir).absolute()
        self.log_dir = Path(log_dir) if log_dir is not None else data_dir / "logs"
        self.work_dir = Path(work_dir) if work_dir is not None else data_dir / "work"
        if checkpoint_root is None:
            env_root = os.environ.get("COSCHED_CHECKPOINT_ROOT")
            checkpoint_root = Path(env_root) if env_root else data_dir / "checkpoints"
        self.checkpoint_root = Path(checkpoint_root).absolute()
        self.stop_grace_s = KILL_GRACE_S  # the portal's COSCHED_STOP_GRACE_S once it answered
        self.state_dir = Path(state_dir) if state_dir is not None else data_dir / "agent" / name
        self.attempts_dir = self.state_dir / "attempts"
        self.lease_file = self.state_dir / "lease.json"
        self.seq_file = self.state_dir / "seq.json"
        self.wake_fifo = self.state_dir / "wake.fifo"  # runners write a byte when a job ends
        if backend_name == "nvml":
            default_pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
            default_log = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
        else:
            default_pipe = str(data_dir / "mps" / name / "pipe")
            default_log = str(data_dir / "mps" / name / "log")
        if backend is not None and hasattr(backend, "shares_dir"):
            backend.shares_dir = self.state_dir / "virtual-gpus"  # workers.emulate_dp
        self.mps_pipe_dir = Path(mps_pipe_dir or default_pipe)
        self.mps_log_dir = Path(mps_log_dir or default_log)
        self.address = address if address is not None else socket.getfqdn()
        self.sample_every_s = sample_every_s
        self.job_users = job_users if job_users is not None else JobUsers.single()
        self.limits = limits
        self.gpu_devices = gpu_devices
        self.gpu_device_dir = gpu_device_dir
        if container_runtimes is None:
            container_runtimes = containers.detect_runtimes(
                os.environ.get("COSCHED_CONTAINER_RUNTIMES")
            )
        self.container_runtimes = tuple(container_runtimes)
        conf = containers_conf or os.environ.get("COSCHED_CONTAINERS_CONF")
        self._own_containers_conf = not conf
        self.containers_conf = Path(conf) if conf else self.state_dir / "containers.conf"
        self.container_network = (
            container_network or os.environ.get("COSCHED_CONTAINER_NETWORK") or "none"
        )
        self._cdi: bool | None = None  # detected at the first container launch
        self._podman_init: bool | None = None
        # Marks every runner and job of this agent (its state directory, hashed), so a
        # restarted agent finds its own leftovers and nobody else's.
        self.marker = marker_for(self.state_dir)
        self.instance = uuid.uuid4().hex[:16]
        self.sync_interval_s = 1.0
        self.lease_deadline: float | None = None  # runner.lease_clock() s
        self.last_sync_ok: float | None = None  # monotonic s
        self._lock = threading.RLock()
        self._attempts: dict[AttemptKey, _Attempt] = {}
        # Ended attempts the portal acknowledged before it had their whole log: where the
        # log is and how much of it was sent.
        self._log_backlog: dict[AttemptKey, tuple[Path, int]] = {}
        self._seq = 0
        self._lock_fd: int | None = None
        self._samples: list[Sample] = []
        self._last_full = -float("inf")  # monotonic s of the last sync that carried samples
        # How often the node lists the checkpoint directories it keeps for the portal to say
        # which may go (SyncRequest.checkpoints; ended jobs' after COSCHED_CHECKPOINT_KEEP_S).
        self.checkpoint_report_every_s = 600.0
        self._last_checkpoint_report = -float("inf")
        self._last_sample = -float("inf")
        self._send_info = True
        self._started = False
        self._failures = 0
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._fifo_r: int | None = None
        self._fifo_w: int | None = None

    # --- start: local state -----------------------------------------------------------------------

    def start(self) -> None:
        """Read the local state: adopt live runners, collect finished ones, kill leftovers.
        Idempotent; ``step`` calls it when it was not called."""
        with self._lock:
            if self._started:
                return
            for warning in self.job_users.check():  # IsolationError: cannot run as configured
                log.warning("%s: %s", self.name, warning)
            self._started = True
            for path in (self.state_dir, self.attempts_dir):
                path.mkdir(parents=True, exist_ok=True)
                os.chmod(path, 0o700)
            self._take_lock()
            self._open_fifo()
            # Jobs may pass through (to their own log and directory), not list or write.
            for path in (self.log_dir, self.work_dir):
                path.mkdir(parents=True, exist_ok=True)
                os.chmod(path, 0o711)  # noqa: S103 (traverse only: see workers.isolation)
            if self.limits is None:
                self.limits = Limits.detect()
                level = logging.INFO if self.limits.kind == "cgroup" else logging.WARNING
                log.log(level, "%s: %s", self.name, self.limits.describe())
            if self.gpu_devices is None:
                self.gpu_devices = gpu_devices_for(
                    self.backend, self.backend_name, self.gpu_device_dir
                )
                # A warning when GPUs with device nodes stay open to every job.
                exposed = self.gpu_devices.nodes and not self.gpu_devices.constrained
                level = logging.WARNING if exposed else logging.INFO
                log.log(level, "%s: %s", self.name, self.gpu_devices.describe())
            stored = runner_files.read_json(self.seq_file) or {}
            self._seq = max(int(stored.get("seq", 0)), int(time.time() * 1000))
            for entry in sorted(self.attempts_dir.iterdir()):
                if entry.is_dir() and not entry.name.startswith("."):
                    self._adopt(entry)
                elif entry.name.startswith("."):
                    shutil.rmtree(entry, ignore_errors=True)  # a launch interrupted mid-write
            keep = set()
            for a in self._attempts.values():
                keep.update(p for p in (a.runner_pid, a.job_pid) if p)
            killed = kill_marked_processes(self.marker, keep_groups=keep)
            if killed:
                log.warning("%s: killed leftover process groups %s", self.name, killed)
            adopted = [str(k) for k, a in self._attempts.items() if a.result is None]
            if adopted:
                log.info("%s: adopted running attempts %s", self.name, ", ".join(adopted))

    def _take_lock(self) -> None:
        """One agent per state directory: a second one (the first frozen, say) must not run
        the same node's attempts. Raises ``AgentLocked``."""
        fd = os.open(self.state_dir / "agent.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            self._started = False
            raise AgentLocked(
                f"another agent process holds {self.state_dir} (node {self.name}); stop it first"
            ) from None
        self._lock_fd = fd

    def _open_fifo(self) -> None:
        with contextlib.suppress(FileExistsError):
            os.mkfifo(self.wake_fifo, 0o600)
        self._fifo_r = os.open(self.wake_fifo, os.O_RDONLY | os.O_NONBLOCK)
        # Our own writer keeps the FIFO from reading as closed when no runner has it open.
        self._fifo_w = os.open(self.wake_fifo, os.O_WRONLY | os.O_NONBLOCK)

    def _adopt(self, directory: Path) -> None:
        """Take over one attempt directory left by an earlier agent process."""
        data = runner_files.read_json(directory / runner_files.SPEC)
        try:
            spec = AttemptSpec.read((data or {}).get("attempt"), "spec")
        except ProtocolError:
            log.warning("%s: unreadable attempt directory %s removed", self.name, directory)
            shutil.rmtree(directory, ignore_errors=True)
            return
        assert data is not None
        a = _Attempt(
            spec=spec,
            dir=directory,
            log_path=Path(data["log"]),
            started_at=float(data.get("created_at", time.time())),
            log_offset=int(data.get("log_offset", 0)),
            log_sent=int(data.get("log_start", data.get("log_offset", 0))),
        )
        runner = runner_files.read_json(directory / runner_files.RUNNER) or {}
        a.runner_pid, a.runner_ticks = runner.get("pid"), runner.get("start_ticks")
        self._read_job(a)
        if a.job_pid and _proc_state(a.job_pid) == "T":
            a.paused = True
        self._attempts[spec.key] = a
        if not self._collect_one(a):
            self._attach(a)
            self._open_pidfd(a)

    # --- the loop ---------------------------------------------------------------------------------

    def nudge(self) -> None:
        """Make the running loop sync now (from any thread)."""
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"!")

    def run(self, stop: threading.Event, interval_s: float | None = None) -> None:
        """Step until ``stop`` is set: every ``interval_s`` (default: the portal's
        ``sync_interval_s``), when nudged, when a runner ends. An error is logged and the next
        round tries again."""
        self.start()
        woken = False
        while not stop.is_set():
            try:
                self.step(urgent=woken)
            except Exception:  # the loop must outlive any one bad round
                log.exception("%s: sync round failed", self.name)
            woken = self.wait(interval_s or self.sync_interval_s, stop)

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        """Wait up to ``timeout`` s, taking metric samples when they are due (they go with the
        next sync); True when woken early (a nudge, a runner that ended)."""
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                return False
            if self.sample_every_s > 0:  # else: samples at every step only
                sample_in = self._last_sample + self.sample_every_s - now
                if sample_in <= 0:
                    with self._lock:
                        self._collect()  # progress from the logs, for the samples
                        self._sample_if_due()
                    continue
                left = min(left, sample_in)
            with self._lock:
                fds = [self._wake_r] + [
                    a.pidfd for a in self._attempts.values() if a.pidfd is not None
                ]
                if self._fifo_r is not None:
                    fds.append(self._fifo_r)
            try:
                ready, _, _ = select.select(fds, [], [], min(left, 0.5))
            except (OSError, ValueError):  # a pidfd closed meanwhile
                time.sleep(0.05)
                continue
            if ready:
                for fd in (self._wake_r, self._fifo_r):
                    if fd is not None and fd in ready:
                        with contextlib.suppress(BlockingIOError, OSError):
                            os.read(fd, 4096)
                return True
        return False

    def step(self, urgent: bool = False) -> bool:
        """One round: collect, sync, reconcile (and sync again after launches and stops).
        ``urgent`` (nudged, a runner ended): metric samples and log tails wait for the next
        periodic sync, so the exchange that starts or ends a job stays small. Returns True when
        the portal answered."""
        self.start()
        with self._lock:
            answered = False
            for _ in range(FOLLOW_UP_SYNCS):
                self._collect()
                self._sample_if_due()
                reply = self._sync(urgent)
                if reply is None:
                    return answered
                answered = True
                urgent = True  # follow-ups carry what changed, nothing else
                if not reply.applied:
                    continue  # sync again with the info or the sequence number it asked for
                if not self._reconcile(reply):
                    break
            return answered

    # --- sync -------------------------------------------------------------------------------------

    def _request(self, urgent: bool = False) -> SyncRequest:
        # Samples and tails ride on periodic syncs; an urgent one skips them unless the last
        # periodic one is overdue (a stream of nudges must not starve the metrics).
        light = urgent and time.monotonic() - self._last_full < 2 * self.sync_interval_s
        running = []
        results = []
        tails = []
        chunks: list[LogChunk] = []
        for a in sorted(self._attempts.values(), key=lambda a: a.key):
            if a.spec.node_rank == 0 and (a.result is not None or not light):
                chunks.extend(self._log_chunks(a, final=a.result is not None))
            if a.result is not None:
                results.append(a.result)
                continue
            if a.stopping:
                state = "stopping"
            elif a.job_pid is None:
                state = "starting"
            else:
                state = "paused" if a.paused else "running"
            running.append(RunningAttempt(a.job_id, a.spec.attempt, state, a.started_at, a.job_pid))
            size = _size(a.log_path)
            if size != a.tail_size and not light and a.spec.node_rank == 0:
                tails.append(LogTail(a.job_id, a.spec.attempt, tail(a.log_path, LOG_TAIL_BYTES)))
                a.sending_tail_size = size  # what the portal has once this request went through
        checkpoints: tuple[int, ...] = ()
        due = time.monotonic() - self._last_checkpoint_report >= self.checkpoint_report_every_s
        if not light and due:
            self._last_checkpoint_report = time.monotonic()
            checkpoints = self.idle_checkpoints()
        self._seq = max(self._seq + 1, int(time.time() * 1000))
        with contextlib.suppress(OSError):
            runner_files.write_json(self.seq_file, {"seq": self._seq})
        return SyncRequest(
            checkpoints=checkpoints,
            node=self.name,
            instance=self.instance,
            seq=self._seq,
            sent_at=time.time(),
            info=self.info() if self._send_info else None,
            running=tuple(running),
            results=tuple(results),
            samples=() if light else tuple(self._samples),
            log_tails=tuple(tails),
            log_chunks=(*chunks, *self._backlog_chunks()),
        )

    def info(self) -> NodeInfo:
        devices = self.backend.devices() if self.backend is not None else []
        return NodeInfo(
            kind=self.kind,
            cores=self.cores,
            memory_mb=self.memory_mb,
            backend=self.backend_name,
            gpus=tuple(device_row(d) for d in devices),
            address=self.address,
            isolation=node_isolation(self.job_users, self.limits, self.gpu_devices),
            container_runtimes=self.container_runtimes,
        )

    def _sync(self, urgent: bool = False) -> SyncReply | None:
        request = self._request(urgent)
        sent = runner_files.lease_clock()
        try:
            reply = self.transport.sync(request)
        except TransportError as exc:
            self._failures += 1
            if self._failures == 1 or self._failures % 30 == 0:
                log.warning("%s: sync failed (%d in a row): %s", self.name, self._failures, exc)
            return None
        if self._failures:
            log.info("%s: sync works again after %d failures", self.name, self._failures)
        self._failures = 0
        self.last_sync_ok = time.monotonic()
        if reply.resync_from is not None:
            log.warning(
                "%s: the portal applied newer requests; numbering from %d",
                self.name,
                reply.resync_from,
            )
            self._seq = max(self._seq, reply.resync_from - 1)
            return reply
        if reply.send_info:
            self._send_info = True
            return reply
        self.sync_interval_s = reply.sync_interval_s
        self.stop_grace_s = reply.stop_grace_s
        self.lease_deadline = sent + reply.lease_s
        self._write_lease(self.lease_deadline, reply.lease_kill_grace_s)
        if request.info is not None:
            self._send_info = False
        # What the portal has now: samples, tails, results it acknowledged.
        if request.samples or not self._samples:
            self._last_full = time.monotonic()
        del self._samples[: len(request.samples)]
        for chunk in request.log_chunks:
            end = chunk.offset + chunk.size
            key = AttemptKey(chunk.job_id, chunk.attempt)
            a = self._attempts.get(key)
            if a is not None:
                a.log_sent = max(a.log_sent, end)
            if key in self._log_backlog:
                path, _ = self._log_backlog[key]
                self._log_backlog[key] = (path, end)
        for key, (path, sent) in list(self._log_backlog.items()):
            if sent >= _size(path):
                del self._log_backlog[key]
        sent_tails = {(t.job_id, t.attempt) for t in request.log_tails}
        for a in self._attempts.values():
            if (a.job_id, a.spec.attempt) in sent_tails:
                # The size when the tail was read: output written since goes with the next.
                a.tail_size = a.sending_tail_size
        for key in reply.acked:
            a = self._attempts.get(key)
            if a is not None and a.result is not None:
                self._forget(a)
        self._drop_checkpoints(reply.drop_checkpoints)
        return reply

    # --- checkpoints ------------------------------------------------------------------------------

    def _live_jobs(self) -> set[int]:
        return {a.job_id for a in self._attempts.values() if a.result is None}

    def idle_checkpoints(self, limit: int = 1000) -> tuple[int, ...]:
        """Jobs whose checkpoint directory is under the checkpoint root and of which this node
        runs no attempt (at most ``limit``, lowest ids first)."""
        live = self._live_jobs()
        found = []
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.checkpoint_root):
                name, _, number = entry.name.partition("-")
                if name != "job" or not number.isdigit() or int(number) < 1:
                    continue
                if int(number) not in live and entry.is_dir(follow_symlinks=False):
                    found.append(int(number))
        return tuple(sorted(found)[:limit])

    def _drop_checkpoints(self, job_ids: tuple[int, ...]) -> None:
        """Delete the checkpoint directories the portal says may go (not of a job running
        here: the portal's answer may be older than a launch)."""
        live = self._live_jobs()
        for job_id in job_ids:
            path = self.checkpoint_dir(job_id)
            if job_id in live or not path.is_dir() or path.is_symlink():
                continue
            shutil.rmtree(path, ignore_errors=True)
            log.info("%s: deleted the checkpoint directory of job %s (%s)", self.name, job_id, path)

    def _write_lease(self, deadline: float, grace_s: float) -> None:
        runner_files.write_json(
            self.lease_file,
            {
                "deadline": deadline,
                "kill_grace_s": grace_s,
                "node": self.name,
                "written_at": time.time(),
            },
        )

    # --- reconcile --------------------------------------------------------------------------------

    def _reconcile(self, reply: SyncReply) -> bool:
        """Make the node match ``reply.desired``; True when something changed that the portal
        should hear about at once (a launch, a stop)."""
        changed = False
        desired = {spec.key: spec for spec in reply.desired}
        for key, spec in desired.items():
            a = self._attempts.get(key)
            if a is None:
                # Not ours (never started here, or its acknowledged result was forgotten and
                # then it is not desired): start it if it may be started. One that started
                # and is not here any more, the portal settles (it sees it missing).
                if spec.launch:
                    self._launch(spec)
                    changed = True
            elif a.result is None and not a.stopping and spec.paused != a.paused:
                self._set_paused(a, spec.paused)
        for key, a in list(self._attempts.items()):
            if key not in desired and a.result is None and not a.stopping:
                self._stop(
                    a,
                    "killed",
                    f"attempt {key.attempt} of job {key.job_id} is no longer assigned to "
                    f"{self.name} (preempted, cancelled, requeued, regrouped or superseded)",
                    self.stop_grace_s,
                )
                changed = True
        return changed

    # --- launch -----------------------------------------------------------------------------------

    def _launch(self, spec: AttemptSpec) -> None:
        """Start one attempt under a runner; a launch that cannot start becomes a
        ``launch_failed`` result (reported at the next sync)."""
        key = spec.key
        final = self.attempts_dir / f"{spec.job_id}-{spec.attempt}"
        tmp = self.attempts_dir / f".{spec.job_id}-{spec.attempt}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(mode=0o700, parents=True)
        log_path = self.log_path(spec.job_id, spec.node_rank)
        a = _Attempt(spec=spec, dir=final, log_path=log_path, started_at=time.time())
        try:
            if final.exists():
                raise LaunchError(f"attempt directory {final} exists already")
            a.profile = _profile_of(spec)
            self._attach(a)
            env = self._job_env(a)
            workdir = self.work_dir / f"job-{spec.job_id}"
            isolation = self._isolation(spec, env, final)
            argv = ["/bin/sh", "-c", spec.command]
            ranks = rank_envs(spec, env, self.name)
            container = None
            if spec.container_image.strip():
                argv, env, container = self._container(spec, a, env, workdir, isolation)
                ranks = None  # one container per node runs the job
            elif not spec.command.strip():
                raise LaunchError("the job has no command")
            a.log_sent = max(0, _size(log_path))  # this attempt's part of the log begins here
            a.log_offset = _write_header(log_path, spec, self.name)
            runner_files.write_json(
                tmp / runner_files.SPEC,
                {
                    "attempt": spec.to_dict(),
                    "argv": argv,
                    "env": env,
                    "ranks": ranks,
                    "container": container,
                    "cwd": str(workdir),
                    "checkpoint_dir": env[CHECKPOINT_DIR_ENV],
                    "time_limit_s": spec.time_limit_s,
                    "time_limit_grace_s": self.stop_grace_s,
                    "log": str(log_path),
                    "log_offset": a.log_offset,
                    "log_start": a.log_sent,
                    # The owner's copies of the output (workers.tee), relative to the work
                    # directory: the portal's patterns filled in, else cosched-<job>.out.
                    "output": env.get("COSCHED_OUTPUT") or f"cosched-{spec.job_id}.out",
                    "error": env.get("COSCHED_ERROR") or "",
                    "lease_file": str(self.lease_file),
                    "lease_deadline": self.lease_deadline or 0.0,
                    "created_at": a.started_at,
                    "wake_fifo": str(self.wake_fifo),
                    "report": self._report_target(spec),
                    # The agent normally collects a result within milliseconds; later than
                    # this, the runner tells the portal itself (well inside the lease margin).
                    "report_after_s": max(2 * self.sync_interval_s, 1.0),
                    "isolation": isolation,
                },
            )
            os.replace(tmp, final)
        except (LaunchError, GpuBackendError, ProfileFormatError, IsolationError, OSError) as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            self._detach(a)
            reason = f"launch failed on {self.name}: {exc}"
            log.warning("%s: job %s: %s", self.name, spec.job_id, reason)
            with contextlib.suppress(OSError), open(log_path, "a", encoding="utf-8") as f:
                f.write(f"[cosched] {reason}\n")
            # Kept on disk like any result, so it is reported even across a restart.
            final.mkdir(mode=0o700, parents=True, exist_ok=True)
            runner_files.write_json(
                final / runner_files.SPEC,
                {"attempt": spec.to_dict(), "log": str(log_path), "created_at": a.started_at},
            )
            runner_files.write_json(
                final / runner_files.RESULT,
                {"outcome": "launch_failed", "exit_code": None, "detail": reason,
                 "started_at": None, "ended_at": time.time()},
                sync=True,
            )  # fmt: skip
            self._attempts[key] = a
            self._collect_one(a)
            return
        # The runner keeps the agent's account (root on a multi-user node): its environment is
        # the agent's few runtime variables, nothing of the job's (LD_PRELOAD, PYTHON*, ...).
        env_runner = runner_env(os.environ)
        env_runner.update(
            {
                MARKER_ENV: self.marker,
                ATTEMPT_DIR_ENV: str(final),
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
                ),
            }
        )
        try:
            with open(final / "runner.log", "ab") as runner_log:
                a.runner = subprocess.Popen(
                    [sys.executable, "-S", "-m", "workers.runner", str(final)],
                    cwd=final,
                    env=env_runner,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=runner_log,
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            runner_files.write_json(
                final / runner_files.RESULT,
                {"outcome": "launch_failed", "exit_code": None,
                 "detail": f"launch failed on {self.name}: cannot start the runner: {exc}",
                 "started_at": None, "ended_at": time.time()},
                sync=True,
            )  # fmt: skip
            self._attempts[key] = a
            self._collect_one(a)
            return
        a.runner_pid = a.runner.pid
        a.runner_ticks = runner_files.start_ticks(a.runner.pid)
        runner_files.write_json(
            final / runner_files.RUNNER, {"pid": a.runner_pid, "start_ticks": a.runner_ticks}
        )
        self._attempts[key] = a
        self._open_pidfd(a)
        log.info("%s: started attempt %s (runner pid %s)", self.name, key, a.runner_pid)

    def _isolation(self, spec: AttemptSpec, env: dict[str, str], directory: Path) -> dict[str, Any]:
        """The attempt's ``isolation`` entry for its runner (``workers.isolation.JobLaunch``):
        the account it runs as, its limits and the GPU device nodes each of its processes
        must not open (the mask file in the attempt's ``directory``). Raises IsolationError
        (the launch fails)."""
        account = self.job_users.account_for(spec.owner)
        if self.limits is None:
            self.limits = Limits.detect()
        if self.gpu_devices is None:
            self.gpu_devices = gpu_devices_for(self.backend, self.backend_name, self.gpu_device_dir)
        part = spec.part
        name = f"{self.marker}-job-{spec.job_id}-{spec.attempt}"
        limits = self.limits.for_job(name, part.cpus, spec.memory_mb, bool(part.gpu_indices))
        entry = {"account": account.to_dict(), "limits": limits}
        devices = self.gpu_devices.for_job(
            process_gpus(spec, env), str(directory / runner_files.GPU_MASK)
        )
        if devices is not None:
            entry["gpu_devices"] = devices
        return entry

    def _container(
        self,
        spec: AttemptSpec,
        a: _Attempt,
        env: dict[str, str],
        workdir: Path,
        isolation: dict[str, Any],
    ) -> tuple[list[str], dict[str, str], dict[str, Any]]:
        """The argv, environment and ``container`` entry of a container attempt's runner
        (docs/containers.md). Podman runs as the agent's account (root) and starts the image as
        the job's account (``--user``) with the job's cores, memory and GPUs: ``isolation``
        then keeps only the account (the runner still makes the job's files its own).
        Apptainer runs as the job's account under the usual isolation. Raises LaunchError."""
        runtime = next((r for r in containers.RUNTIMES if r in self.container_runtimes), None)
        if runtime is None:
            raise LaunchError(f"node {self.name} has no container runtime (docs/containers.md)")
        account = self.job_users.account_for(spec.owner)
        part = spec.part
        if self._cdi is None:
            self._cdi = self.backend_name == "nvml" and containers.cdi_gpus()
        inner = containers.container_env(
            env,
            self._base_env(),
            gpus=len(part.gpu_indices),
            cdi=self._cdi,
            workdir=str(workdir),
            user=account.name,
        )
        mps = bool(part.gpu_indices) and spec.mode == SharingMode.MPS.value
        mounts = [env[CHECKPOINT_DIR_ENV], *([str(self.mps_pipe_dir)] if mps else [])]
        name = containers.container_name(self.marker, spec.job_id, spec.attempt)
        host = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
        if not containers.valid_image(spec.container_image):
            raise LaunchError(f"not an image reference: {spec.container_image!r}")
        if runtime == containers.APPTAINER:
            argv = containers.apptainer_exec_argv(
                spec.container_image,
                spec.command,
                workdir=str(workdir),
                mounts=mounts,
                nvidia=self.backend_name == "nvml" and bool(part.gpu_indices),
            )
            return argv, {**host, **containers.apptainer_env(inner)}, {"runtime": runtime}
        if self._own_containers_conf:
            text = containers.containers_conf()
            with contextlib.suppress(OSError):
                if self.containers_conf.read_text() == text:
                    text = ""
            if text:
                tmp = self.containers_conf.with_suffix(".tmp")
                tmp.write_text(text)
                os.replace(tmp, self.containers_conf)
        if self._podman_init is None:
            self._podman_init = containers.has_podman_init()
        argv = containers.podman_run_argv(
            spec.container_image,
            spec.command,
            inner,
            name=name,
            uid=account.uid,
            gid=account.gid,
            workdir=str(workdir),
            mounts=mounts,
            cpus=part.cpus or None,
            memory_mb=spec.memory_mb,
            devices=containers.gpu_devices(part.gpu_indices, mig_uuid=a.mig_uuid, cdi=self._cdi),
            network=self.container_network,
            ipc_host=mps,
            init=self._podman_init,
        )
        isolation.pop("limits", None)  # Podman's --cpus / --memory hold the container
        isolation.pop("gpu_devices", None)  # the container has only its CDI devices
        isolation["client"] = True  # the runner starts podman itself as its own account
        control = self._podman_env()
        return argv, {**control, **inner}, {"runtime": runtime, "name": name, "env": control}

    def _podman_env(self) -> dict[str, str]:
        """The environment of the agent's and runners' ``podman`` commands."""
        env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
        env["CONTAINERS_CONF"] = str(self.containers_conf)
        return env

    def _podman(self, a: _Attempt, action: str) -> bool:
        """``podman pause|unpause|rm`` of a container attempt's container; False for other
        attempts or when the command failed (logged)."""
        if not a.spec.container_image.strip() or containers.PODMAN not in self.container_runtimes:
            return False
        name = containers.container_name(self.marker, a.spec.job_id, a.spec.attempt)
        argv = containers.podman_control_argv(action, name)
        try:
            subprocess.run(
                argv, env=self._podman_env(), capture_output=True, timeout=60, check=True
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("%s: %s failed: %s", self.name, " ".join(argv), exc)
            return False
        return True

    def _report_target(self, spec: AttemptSpec) -> dict[str, Any] | None:
        """Where the attempt's runner may report its result itself (HTTP only)."""
        target = getattr(self.transport, "report_target", None)
        if target is None:
            return None
        base = target()
        if base is None:
            return None
        return {**base, "node": self.name, "job_id": spec.job_id, "attempt": spec.attempt}

    def _job_env(self, a: _Attempt) -> dict[str, str]:
        spec = a.spec
        part = spec.part
        placement = Placement(
            job_id=str(spec.job_id),
            node=self.name,
            gpu_indices=part.gpu_indices,
            mode=SharingMode(spec.mode) if part.gpu_indices else SharingMode.EXCLUSIVE,
            mps_percentage=spec.mps_percentage,
            mig_profile=spec.mig_profile,
            cpus=part.cpus,
        )
        mig_uuid = a.mig_uuid
        if part.gpu_indices and placement.mode is SharingMode.MIG and mig_uuid is None:
            mig_uuid = a.mig_uuid = self._free_mig_uuid(placement)
        mps = placement.mode is SharingMode.MPS
        extra = {
            "COSCHED_ATTEMPT": str(spec.attempt),
            CHECKPOINT_DIR_ENV: str(self.checkpoint_dir(spec.job_id)),
            **({TIME_LIMIT_ENV: f"{spec.time_limit_s:g}"} if spec.time_limit_s else {}),
            MARKER_ENV: self.marker,
            **gang_env(spec),
            **dict(spec.env),
        }
        # The training SDK's portal URL (workers.sdk): the one this agent syncs with, unless
        # the portal named another (its job token comes in spec.env).
        portal_url = getattr(self.transport, "portal_url", None)
        if portal_url and "COSCHED_API_URL" not in extra:
            extra["COSCHED_API_URL"] = str(portal_url)
        if self.backend is not None and self.backend_name == "virtual":
            # Where emulated data-parallel jobs publish their shares of the virtual GPUs, and
            # how many GPUs the node has (workers.emulate_dp).
            extra["COSCHED_VIRTUAL_GPU_DIR"] = str(self.state_dir / "virtual-gpus")
            extra["COSCHED_NODE_GPUS"] = str(len(self.backend.devices()))
        return build_env(
            placement,
            self._base_env(),
            mig_uuid=mig_uuid,
            gpu_model=spec.gpu_model,
            mps_pipe_dir=self.mps_pipe_dir if mps else None,
            mps_log_dir=self.mps_log_dir if mps else None,
            profile_json=profiles_document([a.profile]) if a.profile is not None else None,
            extra=extra,
        )

    def _free_mig_uuid(self, placement: Placement) -> str:
        """A MIG instance of the placement's profile on its GPU that none of our jobs uses."""
        assert self.backend is not None
        used = {a.mig_uuid for a in self._attempts.values() if a.result is None}
        index = placement.gpu_indices[0]
        for device in self.backend.devices():
            if device.index != index:
                continue
            for mig in device.mig_devices:
                if mig.profile == placement.mig_profile and mig.uuid not in used:
                    return mig.uuid
        raise LaunchError(f"no free MIG instance of profile {placement.mig_profile} on GPU {index}")

    def _base_env(self) -> dict[str, str]:
        """The agent's environment; inside a virtualenv its ``bin`` leads ``PATH`` so a job's
        ``python`` (``python -m workers.emulate``) is the agent's interpreter."""
        env = dict(os.environ)
        if sys.prefix != sys.base_prefix:
            bin_dir = str(Path(sys.executable).parent)
            env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", os.defpath)])
        return env

    def checkpoint_dir(self, job_id: int) -> Path:
        """``<checkpoint root>/job-<id>``: the job's ``COSCHED_CHECKPOINT_DIR``, the same for
        every attempt (created by the runner with the job's working directory)."""
        return self.checkpoint_root / f"job-{job_id}"

    def log_path(self, job_id: int, node_rank: int = 0) -> Path:
        """``<log_dir>/job-<id>.log``: stdout and stderr of every attempt of the job (a gang's
        other ranks: ``job-<id>.rank<r>.log``)."""
        if node_rank:
            return self.log_dir / f"job-{job_id}.rank{node_rank}.log"
        return self.log_dir / f"job-{job_id}.log"

    # --- virtual GPUs -----------------------------------------------------------------------------

    def _virtual(self) -> Any:
        """The backend if it is the virtual one (it has ``attach``), else None."""
        return self.backend if hasattr(self.backend, "attach") else None

    def _attach(self, a: _Attempt) -> None:
        """Make the virtual GPUs follow the attempt (no-op elsewhere and for CPU parts)."""
        virtual = self._virtual()
        part = a.spec.part
        if virtual is None or not part.gpu_indices:
            return
        if a.profile is None:
            a.profile = _profile_of(a.spec)
        vjob = virtual.attach(
            str(a.job_id),
            list(part.gpu_indices),
            a.profile or _bare_profile(a.spec),
            a.spec.mode,
            mps_percentage=a.spec.mps_percentage,
            mig_profile=a.spec.mig_profile,
            job_type=a.spec.job_type,
        )
        a.attached = True
        a.mig_uuid = vjob.mig_uuid
        if a.job_pid:
            virtual.set_pid(str(a.job_id), a.job_pid)
        if a.paused:
            virtual.set_paused(str(a.job_id), True)

    def _detach(self, a: _Attempt) -> None:
        if a.attached and self._virtual() is not None:
            self._virtual().detach(str(a.job_id))
        a.attached = False

    # --- control ----------------------------------------------------------------------------------

    def _set_paused(self, a: _Attempt, paused: bool) -> None:
        """SIGSTOP / SIGCONT the job's process group (once its runner has started it)."""
        if a.job_pid is None:
            self._read_job(a)
        if a.job_pid is None:
            return  # still starting: the next round applies it
        if paused:
            self._podman(a, "pause")  # the container's processes (the client's stop below)
        alive = False
        for pgid in a.job_pgids or (a.job_pid,):
            try:
                os.killpg(pgid, signal.SIGSTOP if paused else signal.SIGCONT)
                alive = True
            except ProcessLookupError:
                continue  # this rank has ended
        if not paused:
            self._podman(a, "unpause")
        if not alive:
            return  # it has ended; collect will see the result
        a.paused = paused
        if a.attached:
            self._virtual().set_paused(str(a.job_id), paused)
        log.info("%s: %s attempt %s", self.name, "paused" if paused else "resumed", a.key)

    def _stop(self, a: _Attempt, outcome: str, detail: str, grace_s: float = KILL_GRACE_S) -> None:
        """Ask the attempt's runner to stop the job (SIGTERM, SIGKILL after ``grace_s``);
        the runner records the result."""
        runner_files.write_json(
            a.dir / runner_files.STOP, {"outcome": outcome, "detail": detail, "grace_s": grace_s}
        )
        a.stopping = True
        if a.runner_pid and runner_files.is_alive(a.runner_pid, a.runner_ticks):
            with contextlib.suppress(ProcessLookupError):
                os.kill(a.runner_pid, signal.SIGTERM)
        log.info("%s: stopping attempt %s: %s", self.name, a.key, detail)

    # --- collect ----------------------------------------------------------------------------------

    def _read_job(self, a: _Attempt) -> None:
        job = runner_files.read_json(a.dir / runner_files.JOB)
        if job is not None and job.get("pid"):
            a.job_pid, a.job_ticks = int(job["pid"]), job.get("start_ticks")
            a.job_pgids = tuple(int(g) for g in job.get("pgids") or ())
            if a.attached and self._virtual() is not None:
                self._virtual().set_pid(str(a.job_id), a.job_pid)

    def _collect(self) -> None:
        for a in list(self._attempts.values()):
            if a.result is None:
                self._collect_one(a)
            if a.result is None:
                self._follow(a)

    def _collect_one(self, a: _Attempt) -> bool:
        """Turn a finished runner's ``result.json`` into a result (True when it has one). A
        runner that died without one: its job's processes are killed, the result says lost."""
        if a.runner is not None:
            a.runner.poll()  # reap our own child, so it does not linger as a zombie
        if a.job_pid is None:
            self._read_job(a)
        data = runner_files.read_json(a.dir / runner_files.RESULT)
        if data is None:
            if runner_files.is_alive(a.runner_pid, a.runner_ticks):
                return False
            data = runner_files.read_json(a.dir / runner_files.RESULT)  # it may just have ended
        if data is None:
            killed = ""
            if a.job_pid and runner_files.is_alive(a.job_pid, a.job_ticks):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(a.job_pid, signal.SIGKILL)
                killed = f"; its job's process group {a.job_pid} was killed"
            if self._podman(a, "rm"):  # a container outlives its client: removed here
                killed += "; its container, if left, was removed"
            data = {
                "outcome": "lost",
                "exit_code": None,
                "detail": f"the runner of attempt {a.key} on {self.name} ended without "
                f"recording a result{killed}",
                "started_at": None,
                "ended_at": time.time(),
            }
            runner_files.write_json(a.dir / runner_files.RESULT, data, sync=True)
        self._follow(a)
        outcome = str(data.get("outcome", "lost"))
        exit_code = data.get("exit_code")
        a.result = AttemptResult(
            job_id=a.job_id,
            attempt=a.spec.attempt,
            outcome=outcome if outcome in OUTCOMES else "lost",
            ended_at=float(data.get("ended_at") or time.time()),
            exit_code=exit_code if isinstance(exit_code, int) else None,
            detail=str(data.get("detail", "")),
            started_at=data.get("started_at"),
            log_tail=tail(a.log_path, LOG_TAIL_BYTES) if a.spec.node_rank == 0 else None,
        )
        if a.result.succeeded and a.spec.node_rank == 0:
            done = Sample("progress", 1.0, time.time(), None, a.job_id, a.spec.attempt)
            self._samples.append(done)
        if a.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(a.pidfd)
            a.pidfd = None
        self._detach(a)
        log.info("%s: attempt %s ended: %s", self.name, a.key, a.result.detail)
        return True

    def _log_chunks(self, a: _Attempt, *, final: bool) -> list[LogChunk]:
        """The next pieces of ``a``'s log the portal does not have (one while it runs, up to
        ``LOG_CHUNKS_PER_SYNC`` once it ended)."""
        if a.log_sent < 0:
            a.log_sent = 0
        return read_log_chunks(
            a.job_id,
            a.spec.attempt,
            a.log_path,
            a.log_sent,
            LOG_CHUNKS_PER_SYNC if final else 1,
        )

    def _backlog_chunks(self) -> list[LogChunk]:
        """Chunks of ended attempts whose result the portal acknowledged before it had their
        whole log."""
        out: list[LogChunk] = []
        for key, (path, sent) in sorted(self._log_backlog.items()):
            out.extend(read_log_chunks(key.job_id, key.attempt, path, sent, LOG_CHUNKS_PER_SYNC))
        return out

    def _forget(self, a: _Attempt) -> None:
        """The portal has the result: drop the attempt's directory (what of its log the portal
        does not have yet goes on in later syncs)."""
        if a.spec.node_rank == 0 and a.log_sent >= 0 and a.log_sent < _size(a.log_path):
            self._log_backlog[a.key] = (a.log_path, a.log_sent)
        self._attempts.pop(a.key, None)
        shutil.rmtree(a.dir, ignore_errors=True)

    def _open_pidfd(self, a: _Attempt) -> None:
        if a.runner_pid and a.pidfd is None:
            with contextlib.suppress(AttributeError, OSError):
                a.pidfd = os.pidfd_open(a.runner_pid)

    # --- metrics ----------------------------------------------------------------------------------

    def _follow(self, a: _Attempt) -> None:
        """Read the job's new ``@cosched`` reports (progress, iterations, run time)."""
        reports, a.log_offset = new_reports(a.log_path, a.log_offset)
        for report in reports:
            if report.event == "start":
                a.run_s = _float(report.get("run_s")) or a.run_s
                a.resumed_from = _float(report.get("resumed_from")) or 0.0
            elif report.event in ("progress", "epoch", "done", "fail", "term"):
                fraction = _float(report.get("fraction"))
                if report.event == "done":
                    fraction = 1.0
                if fraction is not None:
                    a.progress = min(1.0, max(0.0, fraction))
                if "iter" in report.fields:
                    a.iters_done = _int(report.get("iter"))
                elif "steps" in report.fields:
                    a.iters_done = _int(report.get("steps"))
                a.iters_total = _int(report.get("iters")) or a.iters_total
                a.iter_time_s = _float(report.get("iter_time_s")) or a.iter_time_s
                a.active_s = _float(report.get("active_s")) or a.active_s
        if a.attached and a.progress is not None:
            self._virtual().set_progress(str(a.job_id), a.progress)

    def _sample_if_due(self) -> None:
        now_mono = time.monotonic()
        if now_mono - self._last_sample < self.sample_every_s:
            return
        self._last_sample = now_mono
        self._samples.extend(self.samples(time.time()))
        if len(self._samples) > MAX_BUFFERED_SAMPLES:
            del self._samples[: len(self._samples) - MAX_BUFFERED_SAMPLES]

    def samples(self, now: float) -> list[Sample]:
        """One round of readings: per GPU ``util_pct``, ``memory_used_mb``, ``memory_total_mb``;
        per running attempt and GPU the memory and SM utilisation of its own processes
        (``job_gpu_memory_mb``, ``job_gpu_util_pct``: ``workers.gpu.attribution``); per running
        attempt ``progress``, ``steps`` (iterations done, where the job counts them) and the
        live Slow-Down (ALGORITHMS.md §5)."""
        out: list[Sample] = []
        if self.backend is not None:
            try:
                readings = self.backend.sample(now)
            except GpuBackendError as exc:
                log.warning("%s: GPU sampling failed: %s", self.name, exc)
                readings = []
            procs = [
                AttemptProcesses(
                    key=a.key,
                    job_pid=a.job_pid,
                    runner_pid=a.runner_pid,
                    pgids=a.job_pgids,
                    cgroup=f"{self.marker}-job-{a.job_id}-{a.spec.attempt}",
                )
                for a in self._attempts.values()
                if a.result is None
            ]
            for r in readings:
                if r.util_pct is not None:
                    out.append(Sample("util_pct", float(r.util_pct), now, r.index))
                out.append(Sample("memory_used_mb", float(r.memory_used_mb), now, r.index))
                out.append(Sample("memory_total_mb", float(r.memory_total_mb), now, r.index))
                if not procs:
                    continue
                mine = attribute(r.index, r.process_memory_mb, r.process_util_pct, procs)
                for key, got in sorted(mine.items()):
                    job, attempt = key.job_id, key.attempt
                    out.append(Sample(JOB_GPU_MEMORY, got.memory_mb, now, r.index, job, attempt))
                    if got.util_pct is not None:
                        out.append(Sample(JOB_GPU_UTIL, got.util_pct, now, r.index, job, attempt))
        for a in self._attempts.values():
            if a.result is not None or a.spec.node_rank != 0:
                continue  # a gang's job figures come from its rank 0 only
            job, attempt = a.job_id, a.spec.attempt
            if a.progress is not None:
                out.append(Sample("progress", a.progress, now, None, job, attempt))
            if a.iters_done is not None:
                out.append(Sample("steps", float(a.iters_done), now, None, job, attempt))
            sd = live_slowdown(
                now,
                a.started_at,
                a.solo_time_s(),
                progress=a.progress,
                iters_done=a.iters_done,
                iters_total=a.iters_total,
                iter_time_s=a.iter_time_s,
                active_s=a.active_s,
            )
            if sd is not None:
                out.append(Sample("slowdown", float(sd), now, None, job, attempt))
        return out

    # --- introspection and shutdown ---------------------------------------------------------------

    def running(self) -> list[AttemptKey]:
        """The attempts whose processes this agent runs (not yet ended)."""
        with self._lock:
            return sorted(k for k, a in self._attempts.items() if a.result is None)

    def pending_results(self) -> list[AttemptResult]:
        """Results recorded locally and not yet acknowledged by the portal."""
        with self._lock:
            return [a.result for a in self._attempts.values() if a.result is not None]

    def job_pid(self, job_id: int) -> int | None:
        """The process id of job ``job_id``'s running attempt here (None while starting)."""
        with self._lock:
            for a in self._attempts.values():
                if a.job_id == job_id and a.result is None:
                    if a.job_pid is None:
                        self._read_job(a)
                    return a.job_pid
        return None

    def shutdown(self, kill_jobs: bool = False, timeout_s: float = KILL_GRACE_S + 5) -> None:
        """Stop. ``kill_jobs``: stop every job (results "stopped", reported in a last sync, so
        the portal requeues them); else leave them to their runners and the lease (a new agent
        adopts them). Closes the backend."""
        with self._lock:
            if kill_jobs and self._started:
                for a in self._attempts.values():
                    if a.result is None:
                        self._stop(a, "stopped", f"node agent on {self.name} stopped", 2.0)
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline:
                    self._collect()
                    if all(a.result is not None for a in self._attempts.values()):
                        break
                    time.sleep(0.05)
                with contextlib.suppress(Exception):
                    self._sync()
            for a in self._attempts.values():
                if a.pidfd is not None:
                    with contextlib.suppress(OSError):
                        os.close(a.pidfd)
                    a.pidfd = None
            if self.backend is not None:
                self.backend.close()
            for fd in (self._fifo_r, self._fifo_w):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._fifo_r = self._fifo_w = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the state directory's lock
                self._lock_fd = None
            self._started = False


class AgentLocked(RuntimeError):
    """Another agent process uses this state directory."""


# --- helpers --------------------------------------------------------------------------------------


RUNNER_ENV_KEEP = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH", "TMPDIR"})


def runner_env(agent_env: Any) -> dict[str, str]:
    """The environment a runner starts with: ``RUNNER_ENV_KEEP`` and ``LC_*`` of the agent's
    own (the agent adds its marker, the attempt directory and ``PYTHONPATH``)."""
    return {
        k: v
        for k, v in agent_env.items()
        if (k in RUNNER_ENV_KEEP or k.startswith("LC_")) and not is_portal_variable(k)
    }


def marker_for(state_dir: Path) -> str:
    """The ``COSCHED_AGENT_ID`` of the runners and jobs of the agent using ``state_dir``."""
    return hashlib.sha256(str(Path(state_dir).absolute()).encode()).hexdigest()[:16]


def master_port(spec: AttemptSpec) -> int:
    """``MASTER_PORT`` of an attempt: the portal's choice (unique among the attempts whose rank
    0 is on that node, ``portal.core.ports``); from a portal that sends none, one derived from
    the job id and attempt number (29500-30499)."""
    if spec.master_port is not None:
        return spec.master_port
    return 29500 + (spec.job_id % 100) * 10 + spec.attempt % 10


def gang_env(spec: AttemptSpec) -> dict[str, str]:
    """The launcher environment of a multi-process attempt (PyTorch's and Horovod's names):
    ``MASTER_ADDR`` (node rank 0's address), ``MASTER_PORT``, ``WORLD_SIZE``, ``NODE_RANK`` /
    ``GROUP_RANK`` (this node's rank), ``LOCAL_WORLD_SIZE`` and ``COSCHED_NODES`` (every node,
    rank order). One process per node: ``WORLD_SIZE`` is the node count and ``RANK`` the node
    rank, ``LOCAL_RANK`` 0; empty for a single-node attempt. One per GPU
    (``spec.process_per_gpu``, elastic jobs): ``WORLD_SIZE`` counts the GPUs of every node and
    each process's ``RANK`` / ``LOCAL_RANK`` / GPU come from ``rank_envs``; set even on one
    node."""
    if not spec.is_gang and not spec.process_per_gpu:
        return {}
    master = spec.parts[0]
    env = {
        "MASTER_ADDR": master.address or master.node,
        "MASTER_PORT": str(master_port(spec)),
        "WORLD_SIZE": str(spec.world_size),
        "NODE_RANK": str(spec.node_rank),
        "GROUP_RANK": str(spec.node_rank),
        "COSCHED_NODES": ",".join(p.node for p in spec.parts),
    }
    if spec.process_per_gpu:
        env["LOCAL_WORLD_SIZE"] = str(max(1, len(spec.part.gpu_indices)))
    else:
        env.update(RANK=str(spec.node_rank), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    return env


def rank_envs(spec: AttemptSpec, env: dict[str, str], node: str) -> list[dict[str, str]] | None:
    """What each process of a ``process_per_gpu`` part adds to the part's environment ``env``:
    ``RANK`` (global: node ranks in order, GPUs in order within a node), ``LOCAL_RANK``, its own
    GPU in ``CUDA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES`` (one entry of the part's list)
    and ``COSCHED_GPU`` (``node/index``). None: one process for the part."""
    gpus = spec.part.gpu_indices
    if not spec.process_per_gpu or len(gpus) < 1:
        return None
    visible = env.get("CUDA_VISIBLE_DEVICES", "").split(",")
    if not _one_entry_per_gpu(spec, env):  # a MIG instance or a shared GPU: one entry for all
        visible = [",".join(visible)] * len(gpus)
    return [
        {
            "RANK": str(spec.first_rank + i),
            "LOCAL_RANK": str(i),
            "CUDA_VISIBLE_DEVICES": visible[i],
            "NVIDIA_VISIBLE_DEVICES": visible[i],
            "COSCHED_GPU": f"{node}/{index}",
        }
        for i, index in enumerate(gpus)
    ]


def process_gpus(spec: AttemptSpec, env: dict[str, str]) -> list[tuple[int, ...]]:
    """The GPU indices each process of the attempt's part holds, in start order (as
    ``rank_envs``): one process with the part's GPUs (none for a CPU part), or one per GPU with
    its own, or, where the ranks share one ``CUDA_VISIBLE_DEVICES`` entry (``rank_envs``), each
    with all of them."""
    gpus = tuple(spec.part.gpu_indices)
    if not spec.process_per_gpu or not gpus:
        return [gpus]
    if not _one_entry_per_gpu(spec, env):
        return [gpus] * len(gpus)
    return [(index,) for index in gpus]


def _one_entry_per_gpu(spec: AttemptSpec, env: dict[str, str]) -> bool:
    """Whether the part's ``CUDA_VISIBLE_DEVICES`` names each of its GPUs on its own (so each
    rank gets its own), rather than one entry for all (a MIG instance, a shared GPU)."""
    return len(env.get("CUDA_VISIBLE_DEVICES", "").split(",")) == len(spec.part.gpu_indices)


def gpu_device_nodes(devices: list[DeviceInfo], device_dir: str | Path) -> dict[int, str]:
    """GPU index -> its device node: ``<device_dir>/nvidia<N>``, N the GPU's minor number where
    the backend knows it (NVML), else its index."""
    return {
        d.index: os.path.join(
            device_dir, f"nvidia{d.minor_number if d.minor_number is not None else d.index}"
        )
        for d in devices
    }


def gpu_devices_for(
    backend: GpuBackend | None,
    backend_name: str,
    device_dir: str | Path | None,
    *,
    sys_admin: bool | None = None,
) -> GpuDevices:
    """Whether this node can hide GPUs from the jobs not given them (``GpuDevices.detect``):
    the device nodes are in ``device_dir`` (``--gpu-device-dir``; default ``/dev`` for the
    ``nvml`` backend, none for ``virtual``, whose GPUs have no device nodes)."""
    if backend is None:
        return GpuDevices.detect({}, no_nodes="a node without GPUs")
    if device_dir is None and backend_name == "nvml":
        device_dir = "/dev"
    if device_dir is None:
        return GpuDevices.detect(
            {},
            no_nodes="virtual GPUs have no device nodes; --gpu-device-dir DIR names "
            "stand-ins (DIR/nvidia<N> for GPU N)",
        )
    return GpuDevices.detect(gpu_device_nodes(backend.devices(), device_dir), sys_admin=sys_admin)


def _profile_of(spec: AttemptSpec) -> Profile | None:
    if spec.profile is None:
        return None
    return profile_from_json(spec.profile)


def _bare_profile(spec: AttemptSpec) -> Profile:
    """What the virtual GPU knows of a job without a profile: its asked memory, full use."""
    try:
        kind = JobKind(spec.job_kind)
    except ValueError:
        kind = JobKind.OTHER
    return Profile(
        name=spec.job_name or f"job-{spec.job_id}", kind=kind, gpu_memory_max_mb=spec.gpu_memory_mb
    )


def describe(spec: AttemptSpec, node: str) -> str:
    """Where this node's part runs, in words ("gpu-1 GPU 0,1 (mps 40%)")."""
    part = spec.part
    if not part.gpu_indices:
        return f"{node} (CPU, {part.cpus} cores)"
    mode = spec.mode.replace("_", "-")
    extra = f" {spec.mps_percentage}%" if spec.mps_percentage is not None else ""
    extra = f" {spec.mig_profile}" if spec.mig_profile else extra
    gpus = ",".join(map(str, part.gpu_indices))
    return f"{node} GPU {gpus} ({mode}{extra})"


def _write_header(path: Path, spec: AttemptSpec, node: str) -> int:
    """Append one line marking a new attempt; returns the log's size after it (bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    rank = f", node rank {spec.node_rank} of {len(spec.parts)}" if spec.is_gang else ""
    # Private from the start (0600); the runner gives it to the job's account.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    with open(fd, "a", encoding="utf-8") as f:
        f.write(
            f"[cosched] job {spec.job_id} attempt {spec.attempt} on {describe(spec, node)}"
            f"{rank}, {stamp}\n"
        )
        return f.tell()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def kill_marked_processes(
    marker: str, keep_groups: set[int] | frozenset[int] = frozenset(), proc: Path = Path("/proc")
) -> list[int]:
    """SIGKILL the process groups of processes whose environment holds ``COSCHED_AGENT_ID=
    marker`` (runners and jobs of one agent's state directory), except the groups led by the
    pids in ``keep_groups``; returns the killed group ids. Linux only (reads
    ``/proc/<pid>/environ``)."""
    wanted = f"{MARKER_ENV}={marker}".encode()
    groups: set[int] = set()
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            if wanted in (proc / name / "environ").read_bytes().split(b"\0"):
                groups.add(os.getpgid(int(name)))
        except (OSError, ProcessLookupError):
            continue
    groups -= set(keep_groups)
    groups.discard(os.getpgrp())
    for pgid in sorted(groups):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    return sorted(groups)


# --- the HTTP transport and nudges ----------------------------------------------------------------


class HttpTransport:
    """``SyncRequest`` as a POST to ``<portal>/agent/v1/sync`` with the node's token."""

    def __init__(
        self,
        portal_url: str,
        token: str,
        *,
        token_file: Path | None = None,
        timeout_s: float = 15.0,
    ) -> None:
        """``token_file``: where the token came from; runners read it there to report a result
        themselves when the agent cannot (without it they wait for the agent)."""
        self.portal_url = portal_url
        self.token_file = None if token_file is None else Path(token_file).absolute()
        parsed = urllib.parse.urlsplit(portal_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"portal URL {portal_url!r}: give http(s)://host[:port]")
        self.scheme = parsed.scheme
        self.host = parsed.hostname
        self.port = parsed.port
        self.path = parsed.path.rstrip("/") + SYNC_PATH
        self.token = token
        self.timeout_s = timeout_s

    def report_target(self) -> dict[str, Any] | None:
        if self.token_file is None:
            return None
        return {
            "url": self.portal_url,
            "path": RESULTS_PATH,
            "token_file": str(self.token_file),
            "version": PROTOCOL_VERSION,
        }

    def sync(self, request: SyncRequest) -> SyncReply:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.request(
                "POST",
                self.path,
                body=request.to_json().encode(),
                headers={
                    "Authorization": f"{AUTH_SCHEME} {self.token}",
                    "Content-Type": "application/json",
                    "X-Cosched-Protocol": str(PROTOCOL_VERSION),
                },
            )
            response = conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise TransportError(f"portal unreachable: {exc}") from None
        finally:
            conn.close()
        if response.status != 200:
            text = body[:300].decode(errors="replace").strip()
            raise TransportError(f"portal answered HTTP {response.status}: {text}")
        try:
            return SyncReply.from_json(body)
        except ProtocolError as exc:
            raise TransportError(f"bad reply from the portal: {exc}") from None


class NudgeListener(threading.Thread):
    """Subscribes to the node's nudge channel and calls ``on_nudge`` for each message (and
    after every (re)subscription, since nudges sent meanwhile were missed). Reconnects with a
    back-off; Redis being down only makes the agent rely on its periodic sync."""

    def __init__(self, url: str, node: str, on_nudge: Any) -> None:
        super().__init__(name=f"nudges-{node}", daemon=True)
        self.url = url
        self.channel = nudge_channel(node)
        self.on_nudge = on_nudge
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        import redis

        backoff = 0.5
        while not self._halt.is_set():
            try:
                client = redis.Redis.from_url(
                    self.url, socket_connect_timeout=2, socket_timeout=5, health_check_interval=10
                )
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.channel)
                self.on_nudge()
                backoff = 0.5
                while not self._halt.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message is not None and message.get("type") == "message":
                        self.on_nudge()
            except Exception as exc:  # redis errors, DNS, ...: try again later
                log.debug("nudge listener: %s", exc)
                self._halt.wait(backoff)
                backoff = min(5.0, backoff * 2)


# --- command line ---------------------------------------------------------------------------------


def _total_memory_mb() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20)
    except (ValueError, OSError, AttributeError):
        return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workers.agent",
        description="Run a node agent: sync with the portal, run the attempts it assigns.",
    )
    p.add_argument("--name", required=True, help="node name (the token must be this node's)")
    p.add_argument(
        "--portal",
        default=os.environ.get("COSCHED_PORTAL_URL"),
        help="the portal's base URL (default $COSCHED_PORTAL_URL)",
    )
    p.add_argument(
        "--token-file",
        default=os.environ.get("COSCHED_NODE_TOKEN_FILE"),
        help="file holding the node token from `manage.py node_token create NAME` "
        "(default $COSCHED_NODE_TOKEN_FILE, else $COSCHED_NODE_TOKEN)",
    )
    p.add_argument(
        "--nudge-url",
        default=os.environ.get("COSCHED_NUDGE_URL") or os.environ.get("REDIS_URL"),
        help="Redis URL to listen for nudges on (optional; default $COSCHED_NUDGE_URL, "
        "else $REDIS_URL)",
    )
    p.add_argument("--backend", choices=["virtual", "nvml"], default="virtual")
    p.add_argument(
        "--gpus",
        help='virtual GPU models, e.g. "A30x2" or "V100x2,T4" (virtual backend only; '
        "default A30x2 on a GPU node)",
    )
    p.add_argument(
        "--interference",
        default="class_based",
        help="model slowing co-located jobs on virtual GPUs (virtual backend only)",
    )
    p.add_argument("--kind", choices=["gpu", "cpu"], default="gpu")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    p.add_argument("--memory-mb", type=int, default=_total_memory_mb())
    p.add_argument("--interval", type=float, default=None, help="sync period, s (portal's)")
    p.add_argument("--sample-every", type=float, default=2.0, help="metrics period, s")
    p.add_argument(
        "--data-dir",
        default=os.environ.get("COSCHED_DATA_DIR") or "var",
        help="logs, job working directories and the agent's state (default $COSCHED_DATA_DIR)",
    )
    p.add_argument("--address", default=None, help="address other nodes reach this one at")
    p.add_argument(
        "--run-jobs-as",
        default=os.environ.get("COSCHED_RUN_JOBS_AS") or None,
        help="'owner': each job as its portal owner's unix account (needs root); or one "
        "account NAME for every job (default $COSCHED_RUN_JOBS_AS, else 'owner' as root and "
        "this process's own account otherwise)",
    )
    p.add_argument(
        "--job-user-map",
        default=os.environ.get("COSCHED_JOB_USER_MAP") or None,
        help="file of 'portal_user unix_account' lines (owner mode; default "
        "$COSCHED_JOB_USER_MAP); unmapped users run as the account of their name",
    )
    p.add_argument(
        "--fallback-account",
        default=os.environ.get("COSCHED_FALLBACK_ACCOUNT") or None,
        help="account for owners without one on this node (owner mode; default "
        "$COSCHED_FALLBACK_ACCOUNT, else cosched-job; 'none': such jobs fail to launch)",
    )
    p.add_argument(
        "--cgroup-root",
        default=os.environ.get("COSCHED_CGROUP_ROOT") or None,
        help="cgroup v2 directory under which each job gets its own (default "
        "$COSCHED_CGROUP_ROOT, else <cgroup2 mount>/cosched; without a usable one: rlimits)",
    )
    p.add_argument(
        "--gpu-device-dir",
        default=os.environ.get("COSCHED_GPU_DEVICE_DIR") or None,
        help="directory of the GPUs' device nodes, DIR/nvidia<N> for GPU N (N: the minor "
        "number under nvml), hidden from the jobs not given that GPU (default "
        "$COSCHED_GPU_DEVICE_DIR, else /dev with --backend nvml and none with virtual)",
    )
    p.add_argument(
        "--checkpoint-root",
        default=os.environ.get("COSCHED_CHECKPOINT_ROOT"),
        help="where each job's COSCHED_CHECKPOINT_DIR is made (default "
        "$COSCHED_CHECKPOINT_ROOT, else <data-dir>/checkpoints); shared storage lets a "
        "preempted job resume on another node",
    )
    p.add_argument(
        "--container-runtimes",
        default=os.environ.get("COSCHED_CONTAINER_RUNTIMES") or None,
        help="container runtimes this node runs jobs' images with, comma-separated (podman, "
        "apptainer; 'none': no container jobs here; default $COSCHED_CONTAINER_RUNTIMES, else "
        "those installed; docs/containers.md)",
    )
    p.add_argument(
        "--containers-conf",
        default=os.environ.get("COSCHED_CONTAINERS_CONF") or None,
        help="the containers.conf Podman runs with (CONTAINERS_CONF; default "
        "$COSCHED_CONTAINERS_CONF, else one the agent writes in its state directory: runtime "
        "runc, default_ulimits = [], cgroupfs)",
    )
    p.add_argument(
        "--container-network",
        default=os.environ.get("COSCHED_CONTAINER_NETWORK") or "none",
        help="the network of a job's container: none (default; $COSCHED_CONTAINER_NETWORK), "
        "host, or a Podman network's name",
    )
    return p


class UsageError(Exception):
    """A command-line or configuration problem (exit code 2, one line)."""


def _open_backend(opts: argparse.Namespace) -> GpuBackend | None:
    from scheduler.interference import InterferenceError, build_interference
    from workers.gpu import open_backend

    if opts.gpus and opts.backend != "virtual":
        raise UsageError("--gpus describes virtual GPUs; use it with --backend virtual")
    if opts.kind == "cpu":
        if opts.gpus:
            raise UsageError("a CPU node (--kind cpu) has no --gpus")
        return None
    try:
        if opts.backend == "virtual":
            backend = open_backend(
                "virtual",
                models=opts.gpus or "A30x2",
                node=opts.name,
                interference=build_interference(opts.interference),
            )
        else:
            backend = open_backend("nvml")
        if not backend.devices():
            backend.close()
            raise GpuBackendError(f"the {opts.backend} backend sees no GPU on this node")
    except (GpuBackendError, InterferenceError) as exc:
        raise UsageError(f"node {opts.name}: {' '.join(str(exc).split())}") from None
    return backend


def _isolation(opts: argparse.Namespace) -> tuple[JobUsers, Limits]:
    """The job accounts and limits the options ask for; UsageError when this process cannot
    apply them (an agent that is not root asked for owner mode, a missing account, ...)."""
    try:
        users = JobUsers.from_options(opts.run_jobs_as, opts.job_user_map, opts.fallback_account)
        users.check()  # its warnings are logged when the agent starts
    except IsolationError as exc:
        raise UsageError(str(exc)) from None
    limits = Limits.detect(opts.cgroup_root)
    if opts.cgroup_root and limits.kind != "cgroup":
        raise UsageError(f"--cgroup-root {opts.cgroup_root}: {limits.reason}")
    if opts.token_file and users.mode == "owner":
        with contextlib.suppress(OSError):
            if Path(opts.token_file).stat().st_mode & 0o077:
                print(
                    f"node agent: warning: the token file {opts.token_file} is readable by "
                    f"others (chmod 600 it): a job that reads it can act as this node",
                    file=sys.stderr,
                )
    return users, limits


def _token(opts: argparse.Namespace) -> str:
    if opts.token_file:
        try:
            token = Path(opts.token_file).read_text().strip()
        except OSError as exc:
            raise UsageError(f"cannot read the token file: {exc}") from None
    else:
        token = os.environ.get("COSCHED_NODE_TOKEN", "").strip()
    if not token:
        raise UsageError(
            "no node token: create one with `manage.py node_token create NAME --file PATH` "
            "and pass --token-file PATH"
        )
    return token


def main(argv: list[str] | None = None) -> int:
    """``python -m workers.agent``; exit 0 after SIGTERM / SIGINT, 2 on a usage problem."""
    opts = _parser().parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    backend = None
    try:
        if opts.interval is not None and opts.interval <= 0:
            raise UsageError("--interval must be positive")
        if not opts.portal:
            raise UsageError("no portal URL: pass --portal URL (or set COSCHED_PORTAL_URL)")
        token = _token(opts)
        token_file = Path(opts.token_file) if opts.token_file else None
        transport = HttpTransport(opts.portal, token, token_file=token_file)
        backend = _open_backend(opts)
        job_users, limits = _isolation(opts)
        gpu_devices = gpu_devices_for(backend, opts.backend, opts.gpu_device_dir)
        runtimes = containers.detect_runtimes(opts.container_runtimes)
    except (UsageError, ValueError) as exc:
        print(f"node agent: {exc}", file=sys.stderr)
        if backend is not None:
            backend.close()
        return 2
    agent = NodeAgent(
        opts.name,
        backend,
        transport,
        kind=opts.kind,
        cores=opts.cores,
        memory_mb=opts.memory_mb,
        backend_name=opts.backend,
        data_dir=Path(opts.data_dir),
        address=opts.address,
        sample_every_s=opts.sample_every,
        job_users=job_users,
        limits=limits,
        checkpoint_root=Path(opts.checkpoint_root) if opts.checkpoint_root else None,
        gpu_devices=gpu_devices,
        container_runtimes=runtimes,
        containers_conf=Path(opts.containers_conf) if opts.containers_conf else None,
        container_network=opts.container_network,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()
        agent.nudge()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        agent.start()
    except (AgentLocked, IsolationError) as exc:
        print(f"node agent: {exc}", file=sys.stderr)
        if backend is not None:
            backend.close()
        return 2
    gpus = ", ".join(d.model or d.name for d in backend.devices()) if backend else "no GPU"
    print(
        f"node {opts.name}: {opts.kind}, {gpus} ({opts.backend} backend), {opts.cores} cores; "
        f"portal {opts.portal}; state {agent.state_dir}",
        flush=True,
    )
    print(
        f"node {opts.name}: {job_users.describe()}; {limits.describe()}; {gpu_devices.describe()}",
        flush=True,
    )
    print(
        f"node {opts.name}: container runtimes: {', '.join(runtimes) or 'none'}"
        + (f" (network {agent.container_network})" if runtimes else ""),
        flush=True,
    )
    listener = None
    if opts.nudge_url:
        listener = NudgeListener(opts.nudge_url, opts.name, agent.nudge)
        listener.start()
    if agent.step():
        every = opts.interval or agent.sync_interval_s
        print(f"node {opts.name}: registered; syncing every {every:g} s", flush=True)
    try:
        agent.run(stop, opts.interval)
    finally:
        if listener is not None:
            listener.stop()
        agent.shutdown(kill_jobs=False)  # see the module docstring
    return 0


if __name__ == "__main__":
    sys.exit(main())
