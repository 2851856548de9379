"""Container jobs on a node (docs/containers.md): which runtimes a node has, and the commands that
run and control a job's container. Pure functions (argv lists and text), unit-tested; the agent
(``workers.agent``) and the runner (``workers.runner``) call them.

- ``detect_runtimes``: the container runtimes whose command line is installed (``podman``,
  ``apptainer``), as ``NodeInfo.container_runtimes`` reports them; ``COSCHED_CONTAINER_RUNTIMES``
  overrides the detection (``none``: no runtime even where one is installed).
- ``cdi_gpus``: whether the node has a CDI spec for NVIDIA GPUs (``nvidia-ctk cdi generate``
  writes ``/etc/cdi/nvidia.yaml``): then a job's GPUs are given as ``--device nvidia.com/gpu=N``
  and the container sees only those; without one (virtual nodes) no GPU device is passed and the
  container sees the placement through ``CUDA_VISIBLE_DEVICES`` only.
- ``podman_run_argv``: ``podman run`` for one attempt: as the job's account (``--user
  uid:gid``), its cores (``--cpus``) and memory (``--memory``, swap off), its GPUs, its work
  directory mounted at the same path and current (``-v DIR:DIR -w DIR``), no network unless the
  node says otherwise (``--network none``), removed when it ends (``--rm``). The job's variables
  are named with ``-e NAME`` only (values come from the podman process's environment), so a job
  token is not visible in the process list.
- ``podman_control_argv``: ``pause``, ``unpause``, ``stop`` (SIGTERM, SIGKILL after the grace),
  ``rm -f``.
- ``apptainer_exec_argv``: ``apptainer exec`` for nodes with Apptainer only (no Podman).
- ``containers_conf``: the ``containers.conf`` the agent writes for Podman (``CONTAINERS_CONF``):
  runtime ``runc``, no default ulimits, the cgroupfs manager and file events (no systemd
  needed): what Podman needs on hosts with hybrid cgroups, where crun refuses to start.
- ``image_allowed``: the portal's image allow-list (``COSCHED_CONTAINER_IMAGES``).
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence

PODMAN = "podman"
APPTAINER = "apptainer"
RUNTIMES = (PODMAN, APPTAINER)  # in order of preference
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
CDI_GPU_KIND = "nvidia.com/gpu"
# An image reference (``registry/name:tag``, ``name@sha256:...``; for Apptainer also a path or
# ``docker://...``): never an option (a leading ``-`` would be read as one by the runtime).
IMAGE_RE = re.compile(r"[a-zA-Z0-9/][a-zA-Z0-9._/:@+-]*")
# Names the runner gives its containers: unique per attempt (and per agent, by its marker).
NAME_RE = re.compile(r"[^a-zA-Z0-9_.-]")
# Variables never passed into a container: the host's paths and identity (the image has its
# own PATH, the account is --user's).
HOST_ONLY_ENV = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "VIRTUAL_ENV", "PYTHONPATH",
     "TMPDIR"}
)  # fmt: skip
HOST_ONLY_PREFIXES = ("LD_", "XDG_", "SSH_", "SUDO_", "DBUS_")
# The host's locale and time zone do go in.
KEEP_ENV = frozenset({"LANG", "LANGUAGE", "TZ"})


def valid_image(image: str) -> bool:
    """Whether ``image`` is an image reference (``IMAGE_RE``, at most 300 characters)."""
    return len(image) <= 300 and IMAGE_RE.fullmatch(image) is not None


def detect_runtimes(
    setting: str | None = None, which: Callable[[str], str | None] = shutil.which
) -> tuple[str, ...]:
    """The container runtimes this node offers: ``setting`` (``COSCHED_CONTAINER_RUNTIMES``:
    comma-separated names, ``none`` for none; unknown names raise ValueError) when given, else
    every runtime of ``RUNTIMES`` whose command is on ``PATH``."""
    if setting is not None and setting.strip():
        names = [n.strip().lower() for n in setting.split(",") if n.strip()]
        if names == ["none"]:
            return ()
        unknown = [n for n in names if n not in RUNTIMES]
        if unknown:
            raise ValueError(
                f"COSCHED_CONTAINER_RUNTIMES: unknown runtime {', '.join(unknown)} "
                f"(known: {', '.join(RUNTIMES)}, or none)"
            )
        return tuple(n for n in RUNTIMES if n in names)
    return tuple(n for n in RUNTIMES if which(n))


def cdi_gpus(dirs: Iterable[str] = CDI_DIRS) -> bool:
    """Whether a CDI spec for NVIDIA GPUs (kind ``nvidia.com/gpu``) is in ``dirs``."""
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            if not name.endswith((".yaml", ".yml", ".json")):
                continue
            try:
                with open(os.path.join(directory, name), encoding="utf-8") as f:
                    if CDI_GPU_KIND in f.read(1 << 20):
                        return True
            except OSError:
                continue
    return False


def container_name(marker: str, job_id: int, attempt: int, rank: int = 0) -> str:
    """The container's name: ``cosched-<marker>-<job>-<attempt>[-r<rank>]``."""
    name = f"cosched-{marker}-{job_id}-{attempt}" + (f"-r{rank}" if rank else "")
    return NAME_RE.sub("_", name)


def container_env(
    env: Mapping[str, str],
    base: Mapping[str, str],
    *,
    gpus: int = 0,
    cdi: bool = False,
    workdir: str = "",
    user: str = "",
) -> dict[str, str]:
    """The variables that go into a job's container: those of the job's environment ``env``
    that the placement and the portal set (not in the agent's environment ``base``, or changed),
    plus the locale, less the host's paths and identity (``HOST_ONLY_ENV``, ``LD_*``, session
    variables); ``HOME`` is the work directory and ``USER`` / ``LOGNAME`` the account's name.

    With CDI devices (``cdi``, a GPU placement: ``gpus`` > 0) the container sees only its GPUs,
    numbered from 0: ``CUDA_VISIBLE_DEVICES`` is ``0,..,gpus-1`` (a MIG instance's UUID stays),
    and ``NVIDIA_VISIBLE_DEVICES`` is left to the CDI spec. ``COSCHED_GPU_INDICES`` keeps the
    host's indices."""
    out = {
        k: v
        for k, v in env.items()
        if (k in KEEP_ENV or k.startswith("LC_") or base.get(k) != v)
        and k not in HOST_ONLY_ENV
        and not k.startswith(HOST_ONLY_PREFIXES)
    }
    if cdi and gpus > 0:
        out.pop("NVIDIA_VISIBLE_DEVICES", None)
        if not out.get("CUDA_VISIBLE_DEVICES", "").startswith("MIG-"):
            out["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(gpus))
    if workdir:
        out["HOME"] = workdir
    if user:
        out["USER"] = out["LOGNAME"] = user
    return out


def gpu_devices(
    gpu_indices: Sequence[int], *, mig_uuid: str | None = None, cdi: bool = False
) -> list[str]:
    """The CDI device names of a placement's GPUs (``nvidia.com/gpu=0``, or the MIG instance's
    UUID under MIG); empty without a CDI spec on the node (or for a CPU placement)."""
    if not cdi or not gpu_indices:
        return []
    if mig_uuid:
        return [f"{CDI_GPU_KIND}={mig_uuid}"]
    return [f"{CDI_GPU_KIND}={int(i)}" for i in gpu_indices]


def podman_run_argv(
    image: str,
    command: str,
    env_names: Iterable[str],
    *,
    name: str,
    uid: int,
    gid: int,
    workdir: str,
    mounts: Sequence[str] = (),
    cpus: float | None = None,
    memory_mb: int | None = None,
    devices: Sequence[str] = (),
    network: str = "none",
    ipc_host: bool = False,
    init: bool = False,
    podman: str = PODMAN,
) -> list[str]:
    """The ``podman run`` argv of one attempt (see the module docstring).

    ``command``: run by ``/bin/sh -c`` in the image; blank: the image's entry point.
    ``env_names``: variables passed with ``-e NAME`` (their values: the podman process's
    environment). ``mounts``: more host directories mounted at the same path (the checkpoint
    directory, the MPS pipe directory). ``cpus``: a CPU quota (None or 0: none); ``memory_mb``:
    the memory limit, swap included (None: none). ``devices``: CDI device names (``gpu_devices``).
    ``network``: ``none`` (default), ``host``, or a Podman network's name. ``ipc_host``: share
    the host's IPC namespace (MPS clients reach the node's daemon). ``init``: a tiny init
    (Podman's ``catatonit``, where installed) is the container's first process and passes
    SIGTERM on to the job (without it the job's first process is pid 1, which ignores the
    SIGTERM it has no handler for: a stop then ends with SIGKILL after the grace).
    """
    if not valid_image(image):
        raise ValueError(f"not an image reference: {image!r}")
    argv = [podman, "run", "--rm", "--name", name, "--pull", "never"]
    if init:
        argv.append("--init")
    argv += ["--user", f"{int(uid)}:{int(gid)}", "--network", network or "none"]
    argv += ["--security-opt", "no-new-privileges", "--cap-drop", "all"]
    if cpus:
        argv += ["--cpus", f"{float(cpus):g}"]
    if memory_mb:
        argv += ["--memory", f"{int(memory_mb)}m", "--memory-swap", f"{int(memory_mb)}m"]
    for device in devices:
        argv += ["--device", device]
    if ipc_host:
        argv += ["--ipc", "host"]
    for path in dict.fromkeys([workdir, *mounts]):
        if path:
            argv += ["-v", f"{path}:{path}"]
    argv += ["-w", workdir]
    for key in sorted(set(env_names)):
        argv += ["-e", key]
    argv.append(image)
    if command.strip():
        argv += ["/bin/sh", "-c", command]
    return argv


def podman_control_argv(
    action: str, name: str, *, grace_s: float | None = None, podman: str = PODMAN
) -> list[str]:
    """``podman pause|unpause|stop|rm -f NAME``; ``stop`` waits ``grace_s`` seconds (rounded
    up; default 10) before SIGKILL."""
    if action == "stop":
        seconds = 10 if grace_s is None else max(0, math.ceil(grace_s))
        return [podman, "stop", "--time", str(seconds), name]
    if action == "rm":
        return [podman, "rm", "--force", "--ignore", name]
    if action in ("pause", "unpause"):
        return [podman, action, name]
    raise ValueError(f"unknown container action {action!r}")


def apptainer_exec_argv(
    image: str,
    command: str,
    *,
    workdir: str,
    mounts: Sequence[str] = (),
    nvidia: bool = False,
    apptainer: str = APPTAINER,
) -> list[str]:
    """``apptainer exec`` of one attempt, for a node with Apptainer and no Podman: Apptainer
    runs as the calling account (the runner starts it as the job's), with a clean environment
    but the ``APPTAINERENV_*`` variables, the work directory bound and current, ``--nv`` for a
    GPU job on an NVIDIA node. Cores and memory are the job's cgroup's (``workers.isolation``).
    Network: Apptainer shares the host's."""
    if not valid_image(image):
        raise ValueError(f"not an image reference: {image!r}")
    argv = [apptainer, "exec", "--containall", "--cleanenv", "--no-home"]
    if nvidia:
        argv.append("--nv")
    for path in dict.fromkeys([workdir, *mounts]):
        if path:
            argv += ["--bind", f"{path}:{path}"]
    argv += ["--pwd", workdir, image]
    argv += ["/bin/sh", "-c", command] if command.strip() else []
    return argv


def apptainer_env(inner: Mapping[str, str]) -> dict[str, str]:
    """The container's variables (``container_env``) as Apptainer passes them into a
    ``--cleanenv`` container: ``APPTAINERENV_NAME``."""
    return {f"APPTAINERENV_{k}": v for k, v in inner.items()}


def has_podman_init(which: Callable[[str], str | None] = shutil.which) -> bool:
    """Whether Podman's ``--init`` binary (catatonit) is installed."""
    paths = ("/usr/libexec/podman/catatonit", "/usr/lib/podman/catatonit")
    return bool(which("catatonit")) or any(os.path.exists(p) for p in paths)


def containers_conf(runtime: str = "runc") -> str:
    """The ``containers.conf`` the agent writes for Podman (see the module docstring)."""
    return (
        "# Written by the Cosched node agent (docs/containers.md); CONTAINERS_CONF points here.\n"
        "[containers]\n"
        "default_ulimits = []\n"
        'log_driver = "k8s-file"\n'
        "[engine]\n"
        f'runtime = "{runtime}"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
    )


def image_allowed(image: str, patterns: Sequence[str]) -> bool:
    """Whether ``image`` matches one of the allow-list's shell patterns (``fnmatch``, case
    sensitive: ``docker.io/library/*``, ``localhost/*``); an empty list allows every image."""
    if not patterns:
        return True
    return any(fnmatch.fnmatchcase(image, p) for p in patterns)
