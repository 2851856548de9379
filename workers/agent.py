"""The node agent: runs the jobs the scheduler placed on one node (DESIGN.md, Node agent).

One ``NodeAgent`` per node. ``manage.py node_agent`` runs one behind a Celery worker on the
node's queue (``node.<name>``) plus a sampler thread; the embedded default runs several in one
process and finds them with ``local_agent(name)``.

- ``register``: upsert the node and its GPUs (``portal.core.nodes.node_register``). Jobs the
  database says run here but this agent does not follow (it restarted) are requeued, and their
  leftover processes, found by their ``COSCHED_NODE`` / ``COSCHED_JOB_ID`` environment, killed.
- ``launch``: the job's command as a real process (``workers.launcher.JobProcess``, a shell
  command in its own process group, cwd ``<data>/work/job-<id>``) with the environment its
  active placement implies (``build_env``: ``CUDA_VISIBLE_DEVICES``, MPS directories and
  percentage, MIG instance UUID), the profile as ``COSCHED_PROFILE_JSON``; stdout and stderr go
  to ``<data>/logs/job-<id>.log``. SCHEDULED -> RUNNING, actor ``node:<name>``. On the
  ``virtual`` backend the job is attached to its virtual GPUs, whose utilisation and memory then
  follow its profile, its progress and its co-runners.
- ``control``: ``pause`` (SIGSTOP; RUNNING -> PAUSED unless the scheduler already wrote it),
  ``resume`` (SIGCONT; PAUSED -> RUNNING likewise), ``kill`` (the job was cancelled or requeued:
  the process group goes, the row is left as it is).
- ``tick`` (every few seconds, from the sampler thread): reap ended processes (exit status ->
  COMPLETED / FAILED with ``exit_code`` and ``failure_reason``, unless the row has left
  RUNNING / PAUSED, e.g. CANCELLED), follow ``@cosched`` progress reports, record metrics
  (per GPU: ``util_pct``, ``memory_used_mb``, ``memory_total_mb``; per job: ``progress`` and the
  live Slow-Down of ALGORITHMS.md §5), push log tails, send the heartbeat; after a job ends,
  ``workers.triggers.on_job_finished``.

Thread safety: Celery's thread pool calls ``launch`` / ``control`` while the sampler calls
``tick``; one re-entrant lock serialises them. Triggers are called outside the lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scheduler.catalog import UnknownGpuModel, gpu_spec
from scheduler.domain import JobKind, Placement, Profile, SharingMode
from workers.gpu.base import DeviceInfo, GpuBackend, GpuBackendError
from workers.launcher import JobProcess, LaunchError, build_env, exit_to_state, new_reports, tail
from workers.profiles import profiles_document
from workers.slowdown import live_slowdown

if TYPE_CHECKING:
    from portal.core.models import Job, Node
    from portal.core.models import Placement as PlacementRow

log = logging.getLogger(__name__)

LOG_TAIL_BYTES = 16 * 1024  # what the agent pushes for the job page's live log
KILL_GRACE_S = 10.0  # SIGTERM, then SIGKILL after this many seconds


@dataclass
class _Run:
    """One job process this agent follows."""

    job_id: int
    placement_id: int
    process: JobProcess
    placement: Placement
    gpu_model: str | None
    profile: Profile | None
    attached: bool  # to the virtual backend
    log_offset: int  # bytes of the log already read for reports
    started_s: float  # epoch seconds
    killed: bool = False  # kill() was asked: the row's state is someone else's business
    progress: float | None = None
    iters_done: int | None = None
    iters_total: int | None = None
    iter_time_s: float | None = None
    active_s: float | None = None
    run_s: float | None = None  # the emulator's own solo run time (scaled), when it says
    mig_uuid: str | None = None

    def solo_time_s(self) -> float | None:
        """Solo run time (s) for ALGORITHMS.md §5: what the job says it needs alone (the
        emulator's ``run_s``), else the profile's time on this GPU model (or CPU time)."""
        if self.run_s:
            return float(self.run_s)
        if self.profile is None:
            return None
        if self.placement.gpu_indices:
            return self.profile.gpu_time_s.get(self.gpu_model or "")
        return self.profile.cpu_time_s


def _data_dir() -> Path:
    from django.conf import settings

    for name in ("COSCHED_DATA_DIR", "DATA_DIR"):
        value = getattr(settings, name, None)
        if value:
            return Path(value)
    return Path(settings.BASE_DIR) / "var"


def _now() -> datetime:
    return datetime.now(UTC)


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


class NodeAgent:
    """The agent of node ``name``; see the module docstring."""

    def __init__(
        self,
        name: str,
        backend: GpuBackend | None,
        *,
        kind: str = "gpu",
        cores: int = 8,
        memory_mb: int = 32768,
        log_dir: Path | None = None,
        backend_name: str = "virtual",
        work_dir: Path | None = None,
        mps_pipe_dir: Path | None = None,
        mps_log_dir: Path | None = None,
    ) -> None:
        """``backend`` None: a node without GPUs (``kind`` "cpu"). Directories default to
        ``<data>/logs``, ``<data>/work``; MPS directories to the agent's own
        ``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY`` (NVIDIA's defaults without
        them) on ``nvml``, and to ``<data>/mps/<name>/...`` on ``virtual`` (no daemon)."""
        self.name = name
        self.backend = backend
        self.kind = kind
        self.cores = cores
        self.memory_mb = memory_mb
        self.backend_name = backend_name
        base = Path(log_dir).parent if log_dir is not None else _data_dir()
        self.log_dir = Path(log_dir) if log_dir is not None else base / "logs"
        self.work_dir = Path(work_dir) if work_dir is not None else base / "work"
        if backend_name == "nvml":
            default_pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
            default_log = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
        else:
            default_pipe = str(self.log_dir.parent / "mps" / name / "pipe")
            default_log = str(self.log_dir.parent / "mps" / name / "log")
        self.mps_pipe_dir = Path(mps_pipe_dir or default_pipe)
        self.mps_log_dir = Path(mps_log_dir or default_log)
        self.actor = f"node:{name}"
        self._lock = threading.RLock()
        self._runs: dict[int, _Run] = {}
        self._node_id: int | None = None
        self._gpu_ids: dict[int, int] = {}  # GPU index -> Gpu pk

    # --- registration ---------------------------------------------------------------------------

    def register(self) -> Node:
        """Upsert the node and its GPUs (status UP, heartbeat now); requeue jobs this agent
        should run but does not follow (see the module docstring)."""
        from portal.core.nodes import node_register

        devices = self.backend.devices() if self.backend is not None else []
        with self._lock:
            node = node_register(
                self.name,
                kind=self.kind,
                cores=self.cores,
                memory_mb=self.memory_mb,
                backend=self.backend_name,
                gpus=[device_row(d) for d in devices],
            )
            self._load_ids()
            self._adopt_orphans()
        return node

    def _load_ids(self) -> None:
        from portal.core.models import Gpu, Node

        self._node_id = Node.objects.filter(name=self.name).values_list("pk", flat=True).first()
        self._gpu_ids = dict(Gpu.objects.filter(node__name=self.name).values_list("index", "pk"))

    def _adopt_orphans(self) -> None:
        """Requeue RUNNING / PAUSED jobs placed here that no process of ours runs."""
        from portal.core.models import Job
        from portal.core.services import job_transition
        from portal.core.states import IllegalTransition, JobState

        orphans = Job.objects.filter(
            placements__node__name=self.name,
            placements__active=True,
            state__in=[JobState.RUNNING, JobState.PAUSED],
        ).exclude(pk__in=list(self._runs))
        for job in orphans.distinct():
            killed = kill_leftovers(self.name, job.pk)
            message = f"node agent on {self.name} restarted; the job's process is not followed"
            if killed:
                message += f" (killed leftover process {', '.join(map(str, killed))})"
            try:
                job_transition(
                    job, JobState.PENDING, actor=self.actor, message=message, expected=job.state
                )
            except IllegalTransition:
                continue

    # --- launch ---------------------------------------------------------------------------------

    def launch(self, job_id: int) -> None:
        """Start job ``job_id`` (SCHEDULED, with an active placement on this node).

        Idempotent: a second call for the same placement does nothing; a call for a job in
        another state or placed elsewhere is logged and ignored. A command that cannot start
        fails the job (SCHEDULED -> FAILED with the reason)."""
        from portal.core.models import Job
        from portal.core.states import JobState

        ended = False
        with self._lock:
            job = Job.objects.select_related("profile").filter(pk=job_id).first()
            if job is None:
                log.warning("%s: launch of unknown job %s ignored", self.name, job_id)
                return
            row = (
                job.placements.filter(active=True)
                .select_related("node")
                .prefetch_related("gpus")
                .order_by("-id")
                .first()
            )
            current = self._runs.get(job_id)
            if current is not None:
                if row is not None and current.placement_id == row.pk:
                    return  # duplicate delivery
                self._kill_run(current)  # a leftover of an earlier attempt
            if job.state != JobState.SCHEDULED:
                log.info(
                    "%s: job %s is %s, not SCHEDULED; launch ignored", self.name, job_id, job.state
                )
                return
            if row is None or row.node.name != self.name:
                where = "nowhere" if row is None else row.node.name
                log.warning("%s: job %s is placed on %s; launch ignored", self.name, job_id, where)
                return
            try:
                self._start(job, row)
            except (LaunchError, GpuBackendError, OSError) as exc:
                ended = self._fail_launch(job, f"launch failed on {self.name}: {exc}")
        if ended:
            _job_finished(job_id)

    def _start(self, job: Job, row: PlacementRow) -> None:
        from portal.core.adapters import profile_to_domain
        from portal.core.services import job_transition
        from portal.core.states import IllegalTransition, JobState

        gpus = sorted(row.gpus.all(), key=lambda g: g.index)
        placement = Placement(
            job_id=str(job.pk),
            node=self.name,
            gpu_indices=tuple(g.index for g in gpus),
            mode=SharingMode(row.sharing_mode) if gpus else SharingMode.EXCLUSIVE,
            mps_percentage=row.mps_percentage,
            mig_profile=row.mig_profile or None,
            cpus=row.cpus,
        )
        profile = profile_to_domain(job.profile) if job.profile is not None else None
        gpu_model = gpus[0].model if gpus else None

        attached = False
        mig_uuid = None
        if gpus and self._virtual() is not None:
            vjob = self._virtual().attach(  # type: ignore[union-attr]
                str(job.pk),
                list(placement.gpu_indices),
                profile or _bare_profile(job),
                placement.mode,
                mps_percentage=placement.mps_percentage,
                mig_profile=placement.mig_profile,
                job_type=(job.params or {}).get("job_type"),
            )
            attached = True
            mig_uuid = vjob.mig_uuid
        elif gpus and placement.mode is SharingMode.MIG:
            mig_uuid = self._free_mig_uuid(placement)
        try:
            env = build_env(
                placement,
                self._base_env(),
                mig_uuid=mig_uuid,
                gpu_model=gpu_model,
                mps_pipe_dir=self.mps_pipe_dir if placement.mode is SharingMode.MPS else None,
                mps_log_dir=self.mps_log_dir if placement.mode is SharingMode.MPS else None,
                profile_json=profiles_document([profile]) if profile is not None else None,
            )
            if not job.command.strip():
                raise LaunchError("the job has no command (container jobs are not run here yet)")
            log_path = self.log_path(job.pk)
            workdir = self.work_dir / f"job-{job.pk}"
            workdir.mkdir(parents=True, exist_ok=True)
            offset = _write_header(log_path, job, placement, row.pk)
            process = JobProcess.start(job.command, env, log_path, cwd=workdir)
        except BaseException:
            if attached:
                self._virtual().detach(str(job.pk))  # type: ignore[union-attr]
            raise
        run = _Run(
            job_id=job.pk,
            placement_id=row.pk,
            process=process,
            placement=placement,
            gpu_model=gpu_model,
            profile=profile,
            attached=attached,
            log_offset=offset,
            started_s=process.started_at,
            mig_uuid=mig_uuid,
        )
        if attached:
            self._virtual().set_pid(str(job.pk), process.pid)  # type: ignore[union-attr]
        self._runs[job.pk] = run
        where = _describe(placement)
        try:
            job_transition(
                job,
                JobState.RUNNING,
                actor=self.actor,
                message=f"started on {where} (pid {process.pid})",
                expected=JobState.SCHEDULED,
            )
        except IllegalTransition:
            # Cancelled (or requeued) between our read and now: the process must not run.
            log.info("%s: job %s left SCHEDULED while starting; killed", self.name, job.pk)
            self._kill_run(run)

    def _fail_launch(self, job: Job, reason: str) -> bool:
        from portal.core.services import job_transition
        from portal.core.states import IllegalTransition, JobState

        log.warning("%s: job %s: %s", self.name, job.pk, reason)
        with contextlib.suppress(OSError):
            self.log_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError), open(self.log_path(job.pk), "a") as f:
            f.write(f"[cosched] {reason}\n")
        try:
            job_transition(
                job,
                JobState.FAILED,
                actor=self.actor,
                message=reason,
                expected=JobState.SCHEDULED,
                failure_reason=reason,
            )
        except IllegalTransition:
            return False
        self._push_tail(job.pk)
        return True

    def _free_mig_uuid(self, placement: Placement) -> str:
        """A MIG instance of the placement's profile on its GPU that none of our jobs uses."""
        assert self.backend is not None
        used = {r.mig_uuid for r in self._runs.values()}
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

    def log_path(self, job_id: int) -> Path:
        """``<log_dir>/job-<id>.log``: stdout and stderr of every attempt of the job."""
        return self.log_dir / f"job-{job_id}.log"

    # --- control --------------------------------------------------------------------------------

    def control(self, job_id: int, action: str) -> None:
        """``pause``, ``resume`` or ``kill`` job ``job_id``; a job this agent does not run is
        ignored (it ended already, or never started here). Raises ValueError on another action.
        """
        if action not in ("pause", "resume", "kill"):
            raise ValueError(f"unknown control action {action!r}; use pause, resume or kill")
        from portal.core.models import Job
        from portal.core.services import job_transition
        from portal.core.states import IllegalTransition, JobState

        with self._lock:
            run = self._runs.get(job_id)
            if run is None:
                log.info("%s: %s of job %s ignored: not running here", self.name, action, job_id)
                return
            if action == "kill":
                run.killed = True
                run.process.signal_group(signal.SIGTERM)
                run.process.signal_group(signal.SIGCONT)
            else:
                pausing = action == "pause"
                done = run.process.pause() if pausing else run.process.resume()
                if not done:
                    return  # it has ended; the next tick reaps it
                if run.attached:
                    self._virtual().set_paused(str(job_id), pausing)  # type: ignore[union-attr]
                source, target = (
                    (JobState.RUNNING, JobState.PAUSED)
                    if pausing
                    else (JobState.PAUSED, JobState.RUNNING)
                )
                verb = "paused" if pausing else "resumed"
                if not self._owns(run):
                    return
                with contextlib.suppress(IllegalTransition):
                    job_transition(
                        Job(pk=job_id),
                        target,
                        actor=self.actor,
                        message=f"{verb} on {self.name} (SIG{'STOP' if pausing else 'CONT'})",
                        expected=source,
                    )
                return
        # Wait for the group outside the lock: the sampler keeps ticking meanwhile.
        run.process.kill(KILL_GRACE_S)
        with self._lock:
            ended = self._reap(run)
        if ended:
            _job_finished(job_id)

    def _kill_run(self, run: _Run) -> None:
        """Kill a run and forget it, without touching the job's row (caller holds the lock)."""
        run.killed = True
        run.process.kill(KILL_GRACE_S)
        self._forget(run)

    # --- tick -----------------------------------------------------------------------------------

    def tick(self) -> None:
        """One sampler round; see the module docstring."""
        from portal.core.metrics import metrics_record
        from portal.core.models import Node
        from portal.core.nodes import node_heartbeat

        finished: list[int] = []
        with self._lock:
            if self._node_id is None:
                self._load_ids()
            now = time.time()
            for run in list(self._runs.values()):
                self._follow(run)
                if run.process.poll() is not None and self._reap(run):
                    finished.append(run.job_id)
            samples = self._samples(now)
            if samples:
                metrics_record(samples)
            for run in self._runs.values():
                self._push_tail(run.job_id)
            try:
                node_heartbeat(self.name)
            except Node.DoesNotExist:
                log.warning("%s: node row gone; registering again", self.name)
                self.register()
        for job_id in finished:
            _job_finished(job_id)

    def _follow(self, run: _Run) -> None:
        """Read the job's new ``@cosched`` reports (progress, iterations, run time)."""
        reports, run.log_offset = new_reports(run.process.log_path, run.log_offset)
        for report in reports:
            if report.event == "start":
                run.run_s = _float(report.get("run_s")) or run.run_s
            elif report.event in ("progress", "epoch", "done", "fail", "term"):
                fraction = _float(report.get("fraction"))
                if report.event == "done":
                    fraction = 1.0
                if fraction is not None:
                    run.progress = min(1.0, max(0.0, fraction))
                if "iter" in report.fields:
                    run.iters_done = _int(report.get("iter"))
                run.iters_total = _int(report.get("iters")) or run.iters_total
                run.iter_time_s = _float(report.get("iter_time_s")) or run.iter_time_s
                run.active_s = _float(report.get("active_s")) or run.active_s
        if run.attached and run.progress is not None:
            self._virtual().set_progress(str(run.job_id), run.progress)  # type: ignore[union-attr]

    def _reap(self, run: _Run) -> bool:
        """The process has ended: settle the job's row and forget the run (lock held).

        Returns True when the row was moved to a final state here."""
        from portal.core.models import Job
        from portal.core.services import job_transition
        from portal.core.states import IllegalTransition, JobState

        self._follow(run)
        returncode = run.process.poll()
        if returncode is None:
            return False
        self._forget(run)
        self._push_tail(run.job_id)
        target, reason = exit_to_state(returncode)
        if target == "COMPLETED":
            self._record([_sample("progress", 1.0, job_id=run.job_id, node_id=self._node_id)])
        state = Job.objects.filter(pk=run.job_id).values_list("state", flat=True).first()
        if state not in (JobState.RUNNING, JobState.PAUSED) or not self._owns(run):
            # Cancelled, requeued, settled, or running again elsewhere: not ours to change.
            return False
        if run.killed:
            target, reason = "FAILED", f"killed by the node agent on {self.name} ({reason})"
        fields = {
            "exit_code": returncode,
            "failure_reason": "" if target == "COMPLETED" else reason,
        }
        job = Job(pk=run.job_id)
        try:
            if state == JobState.PAUSED and target == "COMPLETED":
                # PAUSED -> COMPLETED is no edge of the state machine: record the resume first.
                job_transition(
                    job,
                    JobState.RUNNING,
                    actor=self.actor,
                    expected=JobState.PAUSED,
                    message="the process ended while paused",
                )
                state = JobState.RUNNING
            job_transition(
                job,
                target,
                actor=self.actor,
                message=f"{reason} on {self.name}",
                expected=state,
                **fields,
            )
        except IllegalTransition:
            return False
        return True

    @staticmethod
    def _owns(run: _Run) -> bool:
        """Is the run's placement still the job's active one (the row is this attempt's)?"""
        from portal.core.models import Placement as PlacementRow

        return PlacementRow.objects.filter(pk=run.placement_id, active=True).exists()

    def _forget(self, run: _Run) -> None:
        self._runs.pop(run.job_id, None)
        if run.attached:
            self._virtual().detach(str(run.job_id))  # type: ignore[union-attr]

    def _samples(self, now: float) -> list[Any]:
        at = datetime.fromtimestamp(now, UTC)
        samples = []
        if self.backend is not None and self._gpu_ids:
            try:
                readings = self.backend.sample(now)
            except GpuBackendError as exc:
                log.warning("%s: GPU sampling failed: %s", self.name, exc)
                readings = []
            for r in readings:
                gpu_id = self._gpu_ids.get(r.index)
                if gpu_id is None:
                    continue
                if r.util_pct is not None:
                    samples.append(_sample("util_pct", r.util_pct, at, gpu_id, self._node_id))
                samples.append(
                    _sample("memory_used_mb", r.memory_used_mb, at, gpu_id, self._node_id)
                )
                samples.append(
                    _sample("memory_total_mb", r.memory_total_mb, at, gpu_id, self._node_id)
                )
        for run in self._runs.values():
            if run.progress is not None:
                samples.append(
                    _sample("progress", run.progress, at, node_id=self._node_id, job_id=run.job_id)
                )
            sd = live_slowdown(
                now,
                run.started_s,
                run.solo_time_s(),
                progress=run.progress,
                iters_done=run.iters_done,
                iters_total=run.iters_total,
                iter_time_s=run.iter_time_s,
                active_s=run.active_s,
            )
            if sd is not None:
                samples.append(
                    _sample("slowdown", sd, at, node_id=self._node_id, job_id=run.job_id)
                )
        return samples

    def _record(self, samples: list[Any]) -> None:
        from portal.core.metrics import metrics_record

        metrics_record(samples)

    def _push_tail(self, job_id: int) -> None:
        from portal.core.metrics import log_tail_store

        log_tail_store(job_id, tail(self.log_path(job_id), LOG_TAIL_BYTES))

    # --- shutdown -------------------------------------------------------------------------------

    def shutdown(self, kill_jobs: bool = True) -> None:
        """Stop following jobs. ``kill_jobs``: kill their processes and requeue the jobs
        (PENDING, "node agent on X stopped"); else leave them running, and the node-lost timeout
        requeues them unless this agent comes back first (``register`` then requeues and kills
        them). Closes the backend and leaves the local registry."""
        from portal.core.models import Job
        from portal.core.services import job_transition
        from portal.core.states import IllegalTransition, JobState

        with self._lock:
            runs = list(self._runs.values())
            for run in runs:
                if kill_jobs:
                    self._kill_run(run)
                    with contextlib.suppress(IllegalTransition):
                        state = Job.objects.filter(pk=run.job_id).values_list("state", flat=True)
                        current = state.first()
                        if current in (JobState.RUNNING, JobState.PAUSED) and self._owns(run):
                            job_transition(
                                Job(pk=run.job_id),
                                JobState.PENDING,
                                actor=self.actor,
                                message=f"node agent on {self.name} stopped",
                                expected=current,
                            )
                else:
                    self._forget(run)
            if self.backend is not None:
                self.backend.close()
            if _AGENTS.get(self.name) is self:
                del _AGENTS[self.name]

    def running_job_ids(self) -> list[int]:
        """Ids of the jobs whose process this agent follows."""
        with self._lock:
            return sorted(self._runs)

    def process_of(self, job_id: int) -> JobProcess | None:
        with self._lock:
            run = self._runs.get(job_id)
            return None if run is None else run.process

    def _virtual(self) -> Any:
        """The backend if it is the virtual one (it has ``attach``), else None."""
        return self.backend if hasattr(self.backend, "attach") else None


# --- helpers ------------------------------------------------------------------------------------


def _sample(
    metric: str,
    value: float,
    at: datetime | None = None,
    gpu_id: int | None = None,
    node_id: int | None = None,
    job_id: int | None = None,
) -> Any:
    from portal.core.metrics import Sample

    return Sample(metric, float(value), at or _now(), gpu_id=gpu_id, node_id=node_id, job_id=job_id)


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


def _bare_profile(job: Job) -> Profile:
    """What the virtual GPU knows of a job without a profile: its asked memory, full use."""
    try:
        kind = JobKind(job.kind)
    except ValueError:
        kind = JobKind.OTHER
    memory = float(job.gpu_memory_mb) if job.gpu_memory_mb else None
    return Profile(name=job.name or f"job-{job.pk}", kind=kind, gpu_memory_max_mb=memory)


def _describe(p: Placement) -> str:
    if not p.gpu_indices:
        return f"{p.node} (CPU, {p.cpus} cores)"
    mode = p.mode.value.replace("_", "-")
    extra = f" {p.mps_percentage}%" if p.mps_percentage is not None else ""
    extra = f" {p.mig_profile}" if p.mig_profile else extra
    gpus = ",".join(map(str, p.gpu_indices))
    return f"{p.node} GPU {gpus} ({mode}{extra})"


def _write_header(path: Path, job: Job, placement: Placement, placement_id: int) -> int:
    """Append one line marking a new attempt; returns the log's size after it (bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = _now().strftime("%Y-%m-%d %H:%M:%S UTC")
    with open(path, "a", encoding="utf-8") as f:
        f.write(
            f"[cosched] job {job.pk} on {_describe(placement)}, placement {placement_id}, {stamp}\n"
        )
        return f.tell()


def _job_finished(job_id: int) -> None:
    try:
        from workers.triggers import on_job_finished
    except ImportError:
        return
    try:
        on_job_finished(job_id)
    except Exception:  # a trigger must not take the agent down; the beat catches up
        log.exception("on_job_finished(%s) failed", job_id)


def kill_leftovers(node: str, job_id: int, proc: Path = Path("/proc")) -> list[int]:
    """Kill the process groups of processes started for ``job_id`` on ``node`` (found by the
    ``COSCHED_NODE`` / ``COSCHED_JOB_ID`` variables their launch set); returns the group ids.
    Linux only (reads ``/proc/<pid>/environ``); elsewhere nothing is found."""
    wanted = {f"COSCHED_NODE={node}".encode(), f"COSCHED_JOB_ID={job_id}".encode()}
    groups: set[int] = set()
    for entry in _pids(proc):
        try:
            environ = set((proc / str(entry) / "environ").read_bytes().split(b"\0"))
            if wanted <= environ:
                groups.add(os.getpgid(entry))
        except (OSError, ProcessLookupError):
            continue
    own = os.getpgrp()
    for pgid in sorted(groups - {own}):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    return sorted(groups - {own})


def _pids(proc: Path) -> Iterable[int]:
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    return [int(n) for n in names if n.isdigit()]


# --- process-local registry ----------------------------------------------------------------------

_AGENTS: dict[str, NodeAgent] = {}


def register_local(agent: NodeAgent) -> None:
    """Make ``agent`` the one ``local_agent(agent.name)`` returns in this process."""
    _AGENTS[agent.name] = agent


def local_agent(name: str) -> NodeAgent | None:
    return _AGENTS.get(name)


def local_agents() -> list[NodeAgent]:
    return [_AGENTS[name] for name in sorted(_AGENTS)]
