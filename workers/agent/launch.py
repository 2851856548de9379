"""Starting an attempt (``Launching``, a part of ``NodeAgent``): its directory, its environment, its
isolation (account, limits, GPU device nodes), its container, its runner; and the virtual GPUs
that follow it."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scheduler.domain import JobKind, Placement, Profile, SharingMode
from workers import containers
from workers import runner as runner_files
from workers.agent.attempt import LocalAttempt
from workers.agent.devices import gpu_devices_for
from workers.agent.envs import gang_env, process_gpus, rank_envs, runner_env
from workers.agent.logs import file_size, write_header
from workers.agent.processes import MARKER_ENV
from workers.gpu.base import GpuBackendError
from workers.isolation import IsolationError, Limits
from workers.launcher import LaunchError, build_env
from workers.profiles import ProfileFormatError, profile_from_json, profiles_document
from workers.protocol import AttemptSpec

log = logging.getLogger(__name__)

CHECKPOINT_DIR_ENV = "COSCHED_CHECKPOINT_DIR"  # the job's directory kept across its attempts
TIME_LIMIT_ENV = "COSCHED_TIME_LIMIT_S"  # the attempt's time limit (s), when it has one
ATTEMPT_DIR_ENV = "COSCHED_ATTEMPT_DIR"  # in every runner's environment
ROOT = Path(__file__).resolve().parents[2]  # the repository (for the runner's PYTHONPATH)


class Launching:
    """The part of ``NodeAgent`` that starts attempts (``_launch``) and keeps the virtual GPUs
    in step with them. A mixin: it works on the agent's state (``attempts_dir``, ``_attempts``,
    ``backend``, ``job_users``, ``limits``, ``gpu_devices``, the container settings, ...), set
    up in ``NodeAgent.__init__``."""

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
        a = LocalAttempt(spec=spec, dir=final, log_path=log_path, started_at=time.time())
        try:
            if final.exists():
                raise LaunchError(f"attempt directory {final} exists already")
            a.profile = profile_of(spec)
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
            a.log_sent = max(0, file_size(log_path))  # this attempt's part of the log begins here
            a.log_offset = write_header(log_path, spec, self.name)
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
        a: LocalAttempt,
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

    def _podman(self, a: LocalAttempt, action: str) -> bool:
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

    def _job_env(self, a: LocalAttempt) -> dict[str, str]:
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

    # --- virtual GPUs -----------------------------------------------------------------------------

    def _virtual(self) -> Any:
        """The backend if it is the virtual one (it has ``attach``), else None."""
        return self.backend if hasattr(self.backend, "attach") else None

    def _attach(self, a: LocalAttempt) -> None:
        """Make the virtual GPUs follow the attempt (no-op elsewhere and for CPU parts)."""
        virtual = self._virtual()
        part = a.spec.part
        if virtual is None or not part.gpu_indices:
            return
        if a.profile is None:
            a.profile = profile_of(a.spec)
        vjob = virtual.attach(
            str(a.job_id),
            list(part.gpu_indices),
            a.profile or bare_profile(a.spec),
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

    def _detach(self, a: LocalAttempt) -> None:
        if a.attached and self._virtual() is not None:
            self._virtual().detach(str(a.job_id))
        a.attached = False


def profile_of(spec: AttemptSpec) -> Profile | None:
    if spec.profile is None:
        return None
    return profile_from_json(spec.profile)


def bare_profile(spec: AttemptSpec) -> Profile:
    """What the virtual GPU knows of a job without a profile: its asked memory, full use."""
    try:
        kind = JobKind(spec.job_kind)
    except ValueError:
        kind = JobKind.OTHER
    return Profile(
        name=spec.job_name or f"job-{spec.job_id}", kind=kind, gpu_memory_max_mb=spec.gpu_memory_mb
    )
