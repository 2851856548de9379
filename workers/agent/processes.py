"""The processes of one agent: the marker its runners and jobs carry (``COSCHED_AGENT_ID``) and
the clean-up of those a dead agent left behind."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
from pathlib import Path

MARKER_ENV = "COSCHED_AGENT_ID"  # in every runner's and job's environment


def marker_for(state_dir: Path) -> str:
    """The ``COSCHED_AGENT_ID`` of the runners and jobs of the agent using ``state_dir``."""
    return hashlib.sha256(str(Path(state_dir).absolute()).encode()).hexdigest()[:16]


def proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


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
