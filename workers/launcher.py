"""Launching and controlling a job's process on a node (DESIGN.md, Node agent).

- ``build_env`` / ``job_env``: the environment a placement implies: ``CUDA_VISIBLE_DEVICES``
  (GPU indices in PCI bus order, the MIG instance UUID under MIG, ``""`` for a CPU job) and
  ``NVIDIA_VISIBLE_DEVICES`` (the same; ``void`` for a CPU job), the MPS
  pipe/log directories and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` under MPS, and ``COSCHED_*``
  variables describing the job to itself (``COSCHED_JOB_ID``, ``COSCHED_NODE``,
  ``COSCHED_GPU_INDICES``, ``COSCHED_SHARING_MODE``, ``COSCHED_GPU_MODEL``, ...). ``build_env``
  starts from the agent's environment minus the portal's configuration and anything that looks
  like a credential (``DATABASE_URL``, ``REDIS_URL``, ``SECRET_KEY``, ...: ``PORTAL_ENV_DENYLIST``).
- ``JobProcess``: a real subprocess in its own process group (so pause/resume/kill reach the
  job's children too), stdout and stderr appended to one log file; or, for a container job, the
  ``docker run`` client process, controlled with ``docker pause/unpause/stop``.
- ``exit_to_state``: an exit status to the job's final state and a human-readable reason.
- ``tail`` and ``read_new_lines`` / ``new_reports``: the log for the job page, and the
  ``@cosched`` report lines (``workers.report_lines``) the agent follows for progress.
- ``docker_run_argv`` / ``docker_control_argv``: the container commands (argv only).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from scheduler.domain import SharingMode
from workers.report_lines import Report, parse_report

# Variables a placement decides; inherited values are dropped so the agent's own never leak.
_CONTROLLED_PREFIXES = ("CUDA_MPS_", "COSCHED_")
_CONTROLLED = {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES"}

# The portal's and the agent's own configuration, never passed to a job: a job runs any user's
# command, and the agent's environment holds the database URL (with its password), the broker,
# Django's secret key and how the deployment is set up. ``build_env`` removes
# - every variable the portal reads (portal/settings.py through portal/env.py; keep this list in
#   step with them and with the README's configuration table), the test and benchmark harness's
#   own (``TEST_*``, ``BENCH_*``), and libpq's connection variables, which psycopg would use;
# - everything Django, Celery and Cosched read by prefix (``DJANGO_SETTINGS_MODULE``,
#   ``DJANGO_SUPERUSER_PASSWORD``, ``CELERY_BROKER_URL``, ``COSCHED_DATA_DIR``, ...);
# - any name that looks like a credential (``*SECRET*``, ``*PASSWORD*``, ``*_TOKEN``, ...).
# ``PATH``, ``HOME``, ``LANG``, ``LD_LIBRARY_PATH`` and the like are kept; the placement's own
# variables (``job_env``) are set after the removal.
PORTAL_ENV_DENYLIST = frozenset(
    {
        # portal/settings.py
        "DATABASE_URL",
        "REDIS_URL",
        "SECRET_KEY",
        "DEBUG",
        "ALLOWED_HOSTS",
        "CSRF_TRUSTED_ORIGINS",
        "STATIC_ROOT",
        "LOG_LEVEL",
        "SECURE_SSL_REDIRECT",
        "SECURE_HSTS_SECONDS",
        "TEST_DB_NAME",
        # the test suite (Makefile, tests/) and benchmarks
        "TEST_DATABASE_URL",
        "TEST_REDIS_URL",
        "BENCH_REDIS_URL",
        "BENCH_PG_ADMIN_URL",
        # libpq / psycopg connection settings
        "PGHOST",
        "PGHOSTADDR",
        "PGPORT",
        "PGDATABASE",
        "PGUSER",
        "PGPASSWORD",
        "PGPASSFILE",
        "PGSERVICE",
        "PGSERVICEFILE",
    }
)
PORTAL_ENV_DENY_PREFIXES = ("COSCHED_", "DJANGO_", "CELERY_")
# Credential-looking names: these anywhere in the (upper-cased) name, or ``TOKEN`` as a whole
# ``_``-separated word (``HF_TOKEN``, ``GITHUB_TOKEN``; not ``TOKENIZERS_PARALLELISM``).
SECRET_ENV_MARKERS = ("SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "PRIVATE_KEY")
SECRET_ENV_WORDS = frozenset({"TOKEN", "TOKENS"})


def is_portal_variable(name: str) -> bool:
    """True if ``name`` is the portal's or the agent's configuration, or looks like a credential
    (see ``PORTAL_ENV_DENYLIST``): a job must not inherit it."""
    upper = name.upper()
    return (
        name in PORTAL_ENV_DENYLIST
        or upper.startswith(PORTAL_ENV_DENY_PREFIXES)
        or any(marker in upper for marker in SECRET_ENV_MARKERS)
        or not SECRET_ENV_WORDS.isdisjoint(upper.split("_"))
    )


class PlacementLike(Protocol):
    """What ``build_env`` reads of a placement; ``scheduler.domain.Placement`` fits."""

    job_id: str
    node: str
    gpu_indices: Sequence[int]
    mode: SharingMode | str
    mps_percentage: int | None
    mig_profile: str | None


class LaunchError(RuntimeError):
    """A job could not be launched or controlled as asked."""


def job_env(
    placement: PlacementLike,
    *,
    mig_uuid: str | None = None,
    gpu_model: str | None = None,
    mps_pipe_dir: str | os.PathLike[str] | None = None,
    mps_log_dir: str | os.PathLike[str] | None = None,
    profile_json: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Only the variables the placement sets (see the module docstring).

    ``mig_uuid`` is required under MIG (the instance the job runs in); ``profile_json`` becomes
    ``COSCHED_PROFILE_JSON`` for ``workers.emulate``; ``extra`` is added last.
    Raises LaunchError for a MIG placement without an instance UUID.
    """
    mode = SharingMode(placement.mode)
    indices = tuple(int(i) for i in placement.gpu_indices)
    env = {
        "COSCHED_JOB_ID": str(placement.job_id),
        "COSCHED_NODE": str(placement.node),
        "COSCHED_GPU_INDICES": ",".join(map(str, indices)),
        "COSCHED_SHARING_MODE": mode.value if indices else "cpu",
        "PYTHONUNBUFFERED": "1",  # Python jobs' output reaches the log as it is printed
    }
    # NVIDIA_VISIBLE_DEVICES: the same devices for a container the job starts itself with the
    # NVIDIA container runtime ("void": none at all for a CPU placement).
    if not indices:
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU placement must not touch any GPU
        env["NVIDIA_VISIBLE_DEVICES"] = "void"
    elif mode is SharingMode.MIG:
        if not mig_uuid:
            raise LaunchError(f"job {placement.job_id}: a MIG placement needs the instance UUID")
        env["CUDA_VISIBLE_DEVICES"] = mig_uuid
        env["NVIDIA_VISIBLE_DEVICES"] = mig_uuid
        env["COSCHED_MIG_UUID"] = mig_uuid
        if placement.mig_profile:
            env["COSCHED_MIG_PROFILE"] = placement.mig_profile
    else:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # so indices mean what NVML and nvidia-smi say
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, indices))
        env["NVIDIA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"]
    if indices and mode is SharingMode.MPS:
        if mps_pipe_dir is not None:
            env["CUDA_MPS_PIPE_DIRECTORY"] = os.fspath(mps_pipe_dir)
        if mps_log_dir is not None:
            env["CUDA_MPS_LOG_DIRECTORY"] = os.fspath(mps_log_dir)
        if placement.mps_percentage is not None:
            pct = int(placement.mps_percentage)
            if not 1 <= pct <= 100:
                raise LaunchError(f"job {placement.job_id}: MPS percentage {pct} not in 1..100")
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(pct)
    if indices and gpu_model:
        env["COSCHED_GPU_MODEL"] = gpu_model
    if profile_json is not None:
        env["COSCHED_PROFILE_JSON"] = profile_json
    env.update(extra or {})
    return env


def build_env(
    placement: PlacementLike,
    base_env: Mapping[str, str] | None = None,
    **options: object,
) -> dict[str, str]:
    """``base_env`` (default: this process's environment) without the variables a placement
    controls and without the portal's configuration and credentials (``is_portal_variable``),
    plus ``job_env(placement, **options)``, which is applied last."""
    base = os.environ if base_env is None else base_env
    env = {
        k: v
        for k, v in base.items()
        if k not in _CONTROLLED
        and not k.startswith(_CONTROLLED_PREFIXES)
        and not is_portal_variable(k)
    }
    env.update(job_env(placement, **options))  # type: ignore[arg-type]
    return env


class ProcessState(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    EXITED = "exited"


class JobProcess:
    """One job's process (group). Create with ``JobProcess.start``."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        log_path: Path,
        *,
        container_name: str | None = None,
        docker: str = "docker",
    ) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.pgid = popen.pid  # start_new_session: the child leads its own group
        self.log_path = log_path
        self.container_name = container_name
        self.docker = docker
        self.started_at = time.time()  # seconds since the epoch
        self._paused = False

    @classmethod
    def start(
        cls,
        command: str | Sequence[str],
        env: Mapping[str, str],
        log_path: str | os.PathLike[str],
        cwd: str | os.PathLike[str] | None = None,
        *,
        container_name: str | None = None,
    ) -> JobProcess:
        """Start ``command`` (a shell string run by ``/bin/sh -c``, or an argv) in a new session.

        stdout and stderr are appended to ``log_path`` (parent directories created); stdin is
        /dev/null. ``container_name``: the command is a ``docker run --name NAME`` argv, and
        pause/resume/kill go through the Docker CLI. Raises LaunchError if it cannot start.
        """
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        if not argv or (isinstance(command, str) and not command.strip()):
            raise LaunchError("empty command")
        path = Path(log_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as log:
            try:
                popen = subprocess.Popen(
                    argv,
                    env=dict(env),
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                raise LaunchError(f"cannot start {shlex.join(argv)}: {exc}") from exc
        return cls(popen, path, container_name=container_name)

    # --- state --------------------------------------------------------------------------------

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    @property
    def state(self) -> ProcessState:
        if self.poll() is not None:
            return ProcessState.EXITED
        return ProcessState.PAUSED if self._paused else ProcessState.RUNNING

    def poll(self) -> int | None:
        """The exit status if the process has ended (negative: killed by that signal), else None."""
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait up to ``timeout`` seconds (None: forever); the exit status, or None on timeout."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    # --- control ------------------------------------------------------------------------------

    def signal_group(self, signum: int) -> bool:
        """Send ``signum`` to the whole process group; False if the group is gone."""
        try:
            os.killpg(self.pgid, signum)
        except ProcessLookupError:
            return False
        return True

    def _docker(self, action: str, grace_s: float | None = None) -> None:
        assert self.container_name is not None
        argv = docker_control_argv(action, self.container_name, grace_s=grace_s, docker=self.docker)
        try:
            subprocess.run(argv, check=True, capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            raise LaunchError(f"{shlex.join(argv)} failed: {exc}") from exc

    def pause(self) -> bool:
        """Stop the job (SIGSTOP to its group, or ``docker pause``); False if it has ended."""
        if self.poll() is not None:
            return False
        if self.container_name:
            self._docker("pause")
        elif not self.signal_group(signal.SIGSTOP):
            return False
        self._paused = True
        return True

    def resume(self) -> bool:
        """Continue a paused job (SIGCONT, or ``docker unpause``); False if it has ended."""
        if self.poll() is not None:
            return False
        if self.container_name:
            self._docker("unpause")
        elif not self.signal_group(signal.SIGCONT):
            return False
        self._paused = False
        return True

    def kill(self, grace_s: float = 10.0) -> int:
        """End the job: SIGTERM to the group (continuing it if paused), SIGKILL after
        ``grace_s`` seconds; then SIGKILL whatever is left of the group. Returns the exit status.
        """
        if self.poll() is None:
            if self.container_name:
                # if the engine fails, fall through to signalling the docker client itself
                with contextlib.suppress(LaunchError):
                    self._docker("stop", grace_s)
            self.signal_group(signal.SIGTERM)
            self.signal_group(signal.SIGCONT)  # a stopped process only sees SIGTERM once resumed
            if self.wait(grace_s) is None:
                self.signal_group(signal.SIGKILL)
                self.popen.wait()
        self.signal_group(signal.SIGKILL)  # children that outlived their parent
        self._paused = False
        return self.popen.returncode


def exit_to_state(returncode: int) -> tuple[str, str]:
    """("COMPLETED" | "FAILED", reason) for an exit status as ``subprocess`` reports it.

    0 -> COMPLETED; a negative status (killed by a signal) -> FAILED "killed by SIGKILL";
    129..192 (a shell's 128+signal) -> FAILED "exit code 137 (SIGKILL)"; else FAILED "exit code N".
    """
    if returncode == 0:
        return "COMPLETED", "exit code 0"
    if returncode < 0:
        return "FAILED", f"killed by {_signal_name(-returncode)}"
    if 128 < returncode <= 128 + 64:
        return "FAILED", f"exit code {returncode} ({_signal_name(returncode - 128)})"
    return "FAILED", f"exit code {returncode}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def tail(path: str | os.PathLike[str], max_bytes: int = 64 * 1024) -> str:
    """The last ``max_bytes`` bytes of a log as text (invalid UTF-8 replaced); "" if missing.

    When cut, the partial first line is dropped so the tail starts at a line boundary.
    """
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            f.seek(start)
            data = f.read()
    except FileNotFoundError:
        return ""
    if start > 0:
        newline = data.find(b"\n")
        data = data[newline + 1 :] if newline >= 0 else data
    return data.decode("utf-8", errors="replace")


def read_new_lines(path: str | os.PathLike[str], offset: int = 0) -> tuple[list[str], int]:
    """Complete lines appended to ``path`` since byte ``offset``, and the offset to pass next.

    A last line without its newline yet is left for the next call. Missing file: ([], offset).
    """
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    chunk = data[: end + 1]
    lines = chunk.decode("utf-8", errors="replace").splitlines()
    return lines, offset + len(chunk)


def new_reports(path: str | os.PathLike[str], offset: int = 0) -> tuple[list[Report], int]:
    """The ``@cosched`` report lines appended since ``offset`` (see ``read_new_lines``)."""
    lines, offset = read_new_lines(path, offset)
    return [r for r in map(parse_report, lines) if r is not None], offset


def docker_run_argv(
    image: str,
    command: str | Sequence[str] | None,
    env: Mapping[str, str],
    *,
    name: str,
    gpu_devices: Sequence[str] = (),
    mps_pipe_dir: str | os.PathLike[str] | None = None,
    workdir: str | None = None,
    docker: str = "docker",
) -> list[str]:
    """The ``docker run`` argv for a container job.

    ``env`` should be ``job_env(...)`` (not the agent's whole environment). ``gpu_devices`` are
    host GPU indices or a MIG UUID, given with ``--gpus "device=..."``; the container sees only
    those, renumbered from 0, so the host's ``CUDA_VISIBLE_DEVICES``/``CUDA_DEVICE_ORDER`` are not
    passed for a GPU job. Under MPS the pipe directory is mounted and the IPC namespace shared
    with the host so the clients reach the node's MPS daemon.
    """
    argv = [docker, "run", "--rm", "--init", "--name", name]
    job_id = env.get("COSCHED_JOB_ID")
    if job_id:
        argv += ["--label", f"cosched.job={job_id}"]
    if gpu_devices:
        argv += ["--gpus", '"device=' + ",".join(gpu_devices) + '"']
    if mps_pipe_dir is not None:
        pipe = os.fspath(mps_pipe_dir)
        argv += ["--ipc=host", "-v", f"{pipe}:{pipe}"]
    for key, value in env.items():
        if gpu_devices and key in _CONTROLLED:  # --gpus decides what the container sees
            continue
        argv += ["-e", f"{key}={value}"]
    if workdir:
        argv += ["-w", workdir]
    argv.append(image)
    if isinstance(command, str) and command.strip():
        argv += ["/bin/sh", "-c", command]
    elif command and not isinstance(command, str):
        argv += list(command)
    return argv


def docker_control_argv(
    action: str, name: str, *, grace_s: float | None = None, docker: str = "docker"
) -> list[str]:
    """``docker pause|unpause|stop|rm -f NAME``; ``stop`` waits ``grace_s`` seconds (rounded up)."""
    if action == "stop":
        seconds = 10 if grace_s is None else max(0, int(-(-grace_s // 1)))
        return [docker, "stop", "--time", str(seconds), name]
    if action == "rm":
        return [docker, "rm", "-f", name]
    if action in ("pause", "unpause"):
        return [docker, action, name]
    raise ValueError(f"unknown docker action {action!r}")
