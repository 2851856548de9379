"""``python -m workers.agent``: the command line of a node agent."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from workers import containers
from workers.agent.devices import gpu_devices_for
from workers.agent.node import AgentLocked, NodeAgent
from workers.agent.transport import HttpTransport, NudgeListener
from workers.gpu.base import GpuBackend, GpuBackendError
from workers.isolation import IsolationError, JobUsers, Limits


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
