"""Fixtures of the isolation tests: real unix accounts (``useradd``; these tests run as root,
like a node agent in multi-user mode), removed at the end of the session."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Portal user -> the unix account the test creates for them.
ACCOUNTS = {"alice": "cst-alice", "mallory": "cst-mallory"}


def _userdel(name: str) -> None:
    subprocess.run(["userdel", name], capture_output=True, check=False)


@pytest.fixture(scope="session")
def accounts() -> Iterator[dict[str, pwd.struct_passwd]]:
    """Two regular accounts (uid >= 1000, own group, no home), by portal user name."""
    if os.geteuid() != 0:
        pytest.fail("tests/security create unix accounts and drop to them: run them as root")
    made = {}
    try:
        for portal_user, name in ACCOUNTS.items():
            _userdel(name)  # left over from an interrupted run
            subprocess.run(
                ["useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh", name],
                check=True,
                capture_output=True,
            )
            made[portal_user] = pwd.getpwnam(name)
        yield made
    finally:
        for name in ACCOUNTS.values():
            _userdel(name)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A data directory every account may traverse (0755 up to /), like /var/lib/cosched: what
    keeps a job out of another's files must be the agent's own modes, not pytest's 0700
    temporary directory."""
    path = Path(tempfile.mkdtemp(prefix="cosched-iso-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def refused_start(launch: Any, directory: Path) -> str:
    """Start ``touch <marker>`` under ``launch`` (a ``workers.isolation.JobLaunch``) as the
    runner would; the start must fail in the child before the command runs. Returns the job's
    log, which says why."""
    log, work = directory / "job.log", directory / "work"
    launch.prepare(str(log), str(work))
    marker = directory / "ran"
    with open(log, "ab") as out, pytest.raises(subprocess.SubprocessError):
        subprocess.Popen(
            ["/bin/sh", "-c", f"touch {marker}"],
            cwd=work,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=launch.preexec,
        )
    assert not marker.exists()
    return log.read_text()
