"""Output files are written as the job's owner (docs/job-control.md): the runner's copy
(``tee``) runs as the owner's unix account, so a file lands owned by them with mode 0600, and
what they may not write (a root directory, root's file behind a link they planted) stays
untouched. Runs as root with a unix account of its own (``cst-jcout``)."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
from collections.abc import Iterator

import pytest

from portal.core.agent_sync import InProcessTransport
from portal.core.models import Job
from tests.security.test_job_isolation import _job, _log, _until_ended, agent_node, node  # noqa: F401
from workers.agent import NodeAgent, kill_marked_processes
from workers.isolation import OWNER, JobUsers

ACCOUNT = "cst-jcout"


@pytest.fixture(scope="module")
def account() -> Iterator[pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.fail("this test creates a unix account and drops to it: run it as root")
    subprocess.run(["userdel", ACCOUNT], capture_output=True, check=False)
    subprocess.run(
        ["useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh", ACCOUNT],
        check=True,
        capture_output=True,
    )
    try:
        yield pwd.getpwnam(ACCOUNT)
    finally:
        subprocess.run(["userdel", ACCOUNT], capture_output=True, check=False)


@pytest.fixture
def agent(node, account, shared_dir):  # noqa: F811
    agent = NodeAgent(
        node.name,
        None,
        InProcessTransport(),
        kind="cpu",
        cores=8,
        memory_mb=16384,
        data_dir=shared_dir,
        sample_every_s=0.0,
        job_users=JobUsers(OWNER, user_map={"alice": ACCOUNT}, fallback="none"),
    )
    yield agent
    agent.shutdown(kill_jobs=True)
    kill_marked_processes(agent.marker)


def _with_output(job: Job, output: str, error: str = "") -> Job:
    Job.objects.filter(pk=job.pk).update(output_path=output, error_path=error)
    return job


def test_output_files_belong_to_the_owner(alice, agent, account, shared_dir):
    job = _job(alice, agent_node(agent), "echo to-out; echo to-err >&2")
    _with_output(job, "%u-%j.out", "%j.err")
    job = _until_ended(agent, job)
    assert job.state == "COMPLETED", (job.failure_reason, _log(agent, job))
    work = agent.work_dir / f"job-{job.pk}"
    out, err = work / f"alice-{job.pk}.out", work / f"{job.pk}.err"
    assert out.read_text() == "to-out\n" and err.read_text() == "to-err\n"
    for path in (out, err):
        info = path.stat()
        assert (info.st_uid, info.st_gid) == (account.pw_uid, account.pw_gid)
        assert stat.S_IMODE(info.st_mode) == 0o600
    assert "to-out" in _log(agent, job) and "to-err" in _log(agent, job)  # the log has both


def test_a_directory_the_owner_cannot_write_stays_untouched(alice, agent, shared_dir):
    closed = shared_dir / "root-only"
    closed.mkdir(mode=0o755)  # root's: others may read, not write
    job = _job(alice, agent_node(agent), "echo hello")
    _with_output(job, str(closed / "out-%j.txt"))
    job = _until_ended(agent, job)
    assert job.state == "COMPLETED"
    assert list(closed.iterdir()) == []  # root could have written it: the copy is not root
    log = _log(agent, job)
    assert f"tee: {closed}/out-{job.pk}.txt: Permission denied" in log
    assert "hello" in log


def test_a_planted_link_to_roots_file_does_not_write_it(alice, agent, account, shared_dir):
    mine = shared_dir / "theirs"
    mine.mkdir(mode=0o755)
    os.chown(mine, account.pw_uid, account.pw_gid)
    target = shared_dir / "precious"
    target.write_text("keep\n")
    target.chmod(0o644)  # root's: a copy running as root would follow the link and write it
    (mine / "out.txt").symlink_to(target)
    job = _job(alice, agent_node(agent), "echo overwrite")
    _with_output(job, str(mine / "out.txt"))
    job = _until_ended(agent, job)
    assert target.read_text() == "keep\n"
    assert f"tee: {mine}/out.txt: Permission denied" in _log(agent, job)
