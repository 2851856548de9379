"""``NodeAgent``: the agent of one node; its state on disk, its loop, its sync with the portal and
how it makes the node match the portal's desired attempts (the module docstring of
``workers.agent`` tells the whole story)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import select
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from workers import containers
from workers import runner as runner_files
from workers.agent.attempt import LocalAttempt
from workers.agent.devices import device_row, gpu_devices_for
from workers.agent.launch import Launching
from workers.agent.logs import LOG_TAIL_BYTES, file_size
from workers.agent.metrics import Sampling
from workers.agent.processes import kill_marked_processes, marker_for, proc_state
from workers.agent.supervise import KILL_GRACE_S, Supervising
from workers.gpu.base import GpuBackend
from workers.isolation import GpuDevices, JobUsers, Limits, node_isolation
from workers.launcher import tail
from workers.protocol import (
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
)

log = logging.getLogger(__name__)

FOLLOW_UP_SYNCS = 4  # at most this many syncs in one step (after launches and stops)


class NodeAgent(Launching, Supervising, Sampling):
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
        self._attempts: dict[AttemptKey, LocalAttempt] = {}
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
        a = LocalAttempt(
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
        if a.job_pid and proc_state(a.job_pid) == "T":
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
            size = file_size(a.log_path)
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
            if sent >= file_size(path):
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
