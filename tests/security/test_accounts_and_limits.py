"""Which unix account runs whose job, and the limits a job gets (``workers.isolation``), against
the node's real user database (accounts made by ``useradd``)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from tests.security.conftest import refused_start
from workers.isolation import (
    OWNER,
    Account,
    IsolationError,
    JobLaunch,
    JobUsers,
    Limits,
    read_user_map,
)


def test_the_map_file_names_the_account_else_the_same_name_else_the_fallback(accounts, tmp_path):
    users_map = tmp_path / "users"
    users_map.write_text("# portal user -> account\nalice cst-alice\n\ncarol cst-mallory  # x\n")
    users = JobUsers.from_options(OWNER, str(users_map), "cst-mallory")
    assert users.check() == []
    assert users.account_for("carol").name == "cst-mallory"  # mapped
    assert users.account_for("cst-alice").uid == accounts["alice"].pw_uid  # same name
    assert users.account_for("nobody-here").name == "cst-mallory"  # the fallback
    alice = users.account_for("alice")
    assert (alice.uid, alice.gid) == (accounts["alice"].pw_uid, accounts["alice"].pw_gid)
    assert alice.gid in alice.groups


def test_system_accounts_and_root_are_never_a_portal_users_by_name(accounts):
    users = JobUsers(OWNER, fallback="cst-mallory")
    for portal_user in ("root", "daemon", "0", "1"):
        assert users.account_for(portal_user).name == "cst-mallory", portal_user
    with pytest.raises(IsolationError, match="never run as root"):
        JobUsers(OWNER, user_map={"alice": "root"}, fallback="none").check()
    with pytest.raises(IsolationError, match="never run as root"):
        JobUsers(OWNER, user_map={"alice": "root"}, fallback="none").account_for("alice")


def test_without_a_fallback_an_unknown_owner_cannot_launch(accounts):
    users = JobUsers(OWNER, fallback="none")
    with pytest.raises(IsolationError, match="'stranger' has no unix account on this node"):
        users.account_for("stranger")


def test_owner_mode_wants_its_fallback_account_to_exist(accounts):
    with pytest.raises(IsolationError, match="useradd --system") as exc:
        JobUsers(OWNER, fallback="cst-no-such-account").check()
    assert "--fallback-account none" in str(exc.value)


def test_a_bad_map_file_is_named_with_its_line(tmp_path):
    path = tmp_path / "users"
    path.write_text("alice cst-alice\nbob\n")
    with pytest.raises(IsolationError, match=rf"{path}:2: expected 'portal_user unix_account'"):
        read_user_map(str(path))
    with pytest.raises(IsolationError, match="applies to --run-jobs-as owner"):
        JobUsers.from_options("cst-alice", str(path))


def test_the_default_is_owner_mode_as_root_and_the_own_account_otherwise():
    users = JobUsers.from_options(None)
    if os.geteuid() == 0:
        assert users.mode == OWNER
    else:
        assert users.mode == "single" and users.account == pwd.getpwuid(os.geteuid()).pw_name
    single = JobUsers.single()
    assert single.account_for("anyone").uid == os.geteuid()


def test_the_job_environment_takes_the_accounts_identity(accounts):
    launch = JobLaunch({"account": Account.lookup("cst-alice").to_dict()})
    env = launch.env(
        {"HOME": "/root", "USER": "root", "XDG_RUNTIME_DIR": "/run/user/0", "PATH": "/bin"}
    )
    assert env["USER"] == env["LOGNAME"] == "cst-alice" and env["PATH"] == "/bin"
    assert "XDG_RUNTIME_DIR" not in env
    assert env["HOME"] == "/"  # no home directory, no working directory given: /
    assert launch.env({}, "/data/work/job-1")["HOME"] == "/data/work/job-1"


def _fake_cgroup_tree(root: Path, controllers: str) -> Path:
    """A directory laid out like a cgroup v2 mount (files only: the kernel is not involved,
    so this checks what the agent writes, not that the kernel enforces it)."""
    (root / "cgroup.controllers").write_text(controllers)
    (root / "cgroup.subtree_control").write_text("")
    (root / "cosched").mkdir()
    (root / "cosched" / "cgroup.subtree_control").write_text("")
    return root / "cosched"


def test_limits_use_cgroup_v2_where_it_has_the_cpu_and_memory_controllers(tmp_path):
    base = _fake_cgroup_tree(tmp_path, "cpuset cpu io memory pids")
    limits = Limits.detect(str(base))
    assert limits.kind == "cgroup"
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu +memory"
    entry = limits.for_job("job-7-1", cpus=2, memory_mb=512, gpu=True)
    launch = JobLaunch({"limits": entry})
    launch.prepare(str(tmp_path / "logs" / "job-7.log"), str(tmp_path / "work" / "job-7"))
    group = base / "job-7-1"
    assert (group / "cpu.max").read_text() == "200000 100000"
    assert (group / "memory.max").read_text() == str(512 * 2**20)
    assert (group / "memory.swap.max").read_text() == "0"
    assert "rlimit_as_mb" not in entry


def test_without_usable_cgroups_the_fallback_is_said_and_is_an_address_space_limit(tmp_path):
    base = _fake_cgroup_tree(tmp_path, "hugetlb")
    limits = Limits.detect(str(base))
    assert limits.kind == "rlimit"
    assert "no cpu and memory controller (available: hugetlb" in limits.reason
    assert "NOT limited by cgroups" in limits.describe()
    assert limits.for_job("j", 2, 300, gpu=False) == {"cpus": 2, "memory_mb": 300,
                                                      "rlimit_as_mb": 300}  # fmt: skip
    # A GPU job's CUDA context reserves far more address space than it uses: a data limit.
    gpu_entry = limits.for_job("j", 2, 300, gpu=True)
    assert "rlimit_as_mb" not in gpu_entry and gpu_entry["rlimit_data_mb"] == 300


def test_the_data_limit_of_a_gpu_job_stops_an_allocation_beyond_its_memory(tmp_path):
    """The fallback limit binds: a process asking 200 MB with a 64 MB limit gets MemoryError
    (and one within it runs)."""
    import subprocess
    import sys

    launch = JobLaunch({"limits": {"rlimit_data_mb": 64}})
    code = "import sys; b = bytearray(int(sys.argv[1]) * 2**20); print('ok', len(b))"
    big = subprocess.run(
        [sys.executable, "-c", code, "200"], preexec_fn=launch.preexec, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert big.returncode != 0 and "MemoryError" in big.stderr
    small = subprocess.run(
        [sys.executable, "-c", code, "1"], preexec_fn=launch.preexec, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert small.returncode == 0 and small.stdout.startswith("ok")


def test_a_job_that_cannot_be_confined_does_not_run_and_its_log_says_why(accounts, tmp_path):
    """Fail closed: if joining the cgroup (or dropping privileges) fails in the child, the
    command never runs, as the account or as the runner."""
    group = tmp_path / "cg"
    (group / "cgroup.procs").mkdir(parents=True)  # cannot be written: the join fails
    launch = JobLaunch(
        {"account": Account.lookup("cst-alice").to_dict(), "limits": {"cgroup": str(group)}}
    )
    log_text = refused_start(launch, tmp_path)
    assert "[cosched] the job cannot start: [Errno 21] Is a directory" in log_text
