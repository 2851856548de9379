"""Attacks by a job on the real node agent, its runners and other users' jobs (issue 12).

The agent (``workers.agent.NodeAgent``, in this process, which is root like a multi-user agent
and holds the test's ``DATABASE_URL`` in its environment) runs jobs as their owners' unix
accounts (``--run-jobs-as owner`` with a user map), through real runners and real job
processes. Mallory's job then tries what a malicious job would; each test fails if the agent ran
the jobs as one account (``JobUsers.single()``), or left logs, directories or its state readable.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from portal.core.agent_sync import InProcessTransport
from portal.core.models import Job, Node, Placement, PlacementPart
from tests.security.conftest import ACCOUNTS
from workers.agent import NodeAgent, NudgeListener, kill_marked_processes
from workers.isolation import OWNER, JobUsers
from workers.protocol import nudge_channel

NODE = "iso-cpu-1"
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def mallory(django_user_model):
    return django_user_model.objects.create_user("mallory", password="pw-mallory-123")


@pytest.fixture
def node(db) -> Node:
    return Node.objects.create(name=NODE, kind="cpu", cores=8, memory_mb=16384)


@pytest.fixture
def token_file(shared_dir) -> Path:
    token = shared_dir / "node.token"
    token.write_text("cosn_node_token_canary\n")
    token.chmod(0o600)  # as the deployment guide says
    return token


def _agent(shared_dir: Path, transport) -> NodeAgent:
    return NodeAgent(
        NODE,
        None,
        transport,
        kind="cpu",
        cores=8,
        memory_mb=16384,
        data_dir=shared_dir,
        sample_every_s=0.0,
        job_users=JobUsers(OWNER, user_map=dict(ACCOUNTS), fallback="none"),
    )


@pytest.fixture
def agent(node, accounts, shared_dir, token_file):
    agent = _agent(shared_dir, InProcessTransport())
    yield agent
    agent.shutdown(kill_jobs=True)
    kill_marked_processes(agent.marker)


def _job(owner, node: Node, command: str, *, memory_mb: int | None = None) -> Job:
    """A SCHEDULED CPU job with its first attempt on ``node``, as the scheduler leaves it."""
    job = Job.objects.create(
        owner=owner, name="t", command=command, gpus=0, state="SCHEDULED", memory_mb=memory_mb
    )
    placement = Placement.objects.create(
        job=job, attempt=1, node=node, sharing_mode="exclusive", policy="test", cpus=1
    )
    PlacementPart.objects.create(
        placement=placement, node=node, node_rank=0, gpu_indices=[], cpus=1
    )
    return job


def _state(job: Job) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job.pk)


def _until_ended(agent: NodeAgent, job: Job, timeout: float = 30.0) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        agent.step()
        if _state(job) in ("COMPLETED", "FAILED"):
            job.refresh_from_db()
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job.pk} still {_state(job)}")


def _running_pid(agent: NodeAgent, job: Job, timeout: float = 15.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        agent.step()
        pid = agent.job_pid(job.pk)
        if pid and _state(job) == "RUNNING":
            return pid
        time.sleep(0.02)
    raise AssertionError(f"job {job.pk} did not start ({_state(job)})")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _uid(pid: int) -> int:
    return os.stat(f"/proc/{pid}").st_uid


def _log(agent: NodeAgent, job: Job) -> str:
    return agent.log_path(job.pk).read_text(errors="replace")


def _runner_pid(agent: NodeAgent, job: Job) -> int:
    (attempt,) = [a for a in agent._attempts.values() if a.job_id == job.pk]
    assert attempt.runner_pid
    return attempt.runner_pid


def test_a_job_runs_as_its_owner_with_a_private_log_and_directory(alice, agent, accounts):
    job = _job(alice, agent_node(agent), "id -u; id -g; umask; echo $HOME $USER; pwd")
    job = _until_ended(agent, job)

    assert job.state == "COMPLETED", _log(agent, job)
    account = accounts["alice"]
    lines = _log(agent, job).splitlines()[1:]  # after the agent's header
    assert lines[0] == str(account.pw_uid) and lines[1] == str(account.pw_gid)
    assert lines[2] == "0077"
    assert lines[3].split() == [lines[4], "cst-alice"]  # no home directory: HOME is the cwd
    log = agent.log_path(job.pk).stat()
    assert (log.st_uid, stat.S_IMODE(log.st_mode)) == (account.pw_uid, 0o600)
    work = Path(lines[4]).stat()
    assert (work.st_uid, stat.S_IMODE(work.st_mode)) == (account.pw_uid, 0o700)
    # The directories above: traversable, not listable or writable by jobs.
    for directory in (agent.log_dir, agent.work_dir):
        mode = directory.stat()
        assert mode.st_uid == 0 and stat.S_IMODE(mode.st_mode) == 0o711
    assert stat.S_IMODE(agent.state_dir.stat().st_mode) == 0o700


def test_a_job_cannot_read_the_agents_or_its_runners_environment(mallory, agent, token_file):
    """The agent's environment holds DATABASE_URL (the test's; a deployment's has the
    password); the runner's names the agent's state. Neither reaches the job: not through
    /proc/<pid>/environ, not in its own environment, not through the agent's files."""
    assert "DATABASE_URL" in os.environ  # what a leak would show
    targets = {
        "agent": f"/proc/{os.getpid()}/environ",
        "runner": "/proc/$PPID/environ",
        "token": str(token_file),
        "lease": str(agent.lease_file),
        "attempts": str(agent.attempts_dir),
    }
    probes = "; ".join(
        f"if {'ls' if name == 'attempts' else 'cat'} {path} >/dev/null 2>&1;"
        f' then echo "READ {name}"; else echo "DENIED {name}"; fi'
        for name, path in targets.items()
    )
    command = f"{probes}; cat /proc/$PPID/environ /proc/{os.getpid()}/environ; env"
    job = _job(mallory, agent_node(agent), command)
    job = _until_ended(agent, job)

    log = _log(agent, job)
    for name in targets:
        assert f"DENIED {name}" in log, log
    assert "READ " not in log
    assert "DATABASE_URL" not in log and "REDIS_URL" not in log
    assert "COSCHED_ATTEMPT_DIR" not in log  # the runner's own environment
    assert "cosn_node_token_canary" not in log
    assert "USER=cst-mallory" in log


def test_a_job_cannot_read_another_users_log_or_files(alice, mallory, agent):
    secret = "ALICE-PRIVATE-7f3a9c"
    victim = _job(alice, agent_node(agent), f"echo {secret}; echo {secret} > notes.txt; sleep 60")
    _running_pid(agent, victim)
    deadline = time.monotonic() + 10
    while secret not in _log(agent, victim) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert secret in _log(agent, victim)  # there is something to steal
    victim_log = agent.log_path(victim.pk)
    victim_dir = agent.work_dir / f"job-{victim.pk}"
    command = (
        f"cat {victim_log}; echo log=$?; cat {victim_dir}/notes.txt; echo notes=$?; "
        f"ls {agent.log_dir}; echo list=$?; echo spoof >> {victim_log}; echo write=$?"
    )
    attacker = _job(mallory, agent_node(agent), command)
    attacker = _until_ended(agent, attacker)

    log = _log(agent, attacker)
    assert secret not in log
    for probe in ("log", "notes", "list", "write"):
        assert f"{probe}=0" not in log, log
        assert f"{probe}=" in log
    assert "spoof" not in _log(agent, victim)
    assert _state(victim) == "RUNNING"


def test_a_job_cannot_kill_another_users_job_or_its_runner(alice, mallory, agent, accounts):
    victim = _job(alice, agent_node(agent), "sleep 60")
    pid = _running_pid(agent, victim)
    runner = _runner_pid(agent, victim)
    assert _uid(pid) == accounts["alice"].pw_uid and _uid(runner) == 0
    command = (
        f"kill -KILL {pid}; echo job=$?; kill -KILL -{pid}; echo group=$?; "
        f"kill -STOP {pid}; echo stop=$?; kill -TERM {runner}; echo runner=$?"
    )
    attacker = _job(mallory, agent_node(agent), command)
    attacker = _until_ended(agent, attacker)

    log = _log(agent, attacker)
    for probe in ("job", "group", "stop", "runner"):
        assert f"{probe}=1" in log, log
    agent.step()
    assert _alive(pid) and _alive(runner)
    assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "S"
    assert _state(victim) == "RUNNING"


def _resp_publish(channel: str, message: str) -> str:
    """A Redis PUBLISH in the wire protocol, as printf(1) format text."""
    parts = ["PUBLISH", channel, message]
    data = f"*{len(parts)}\\r\\n" + "".join(f"${len(p.encode())}\\r\\n{p}\\r\\n" for p in parts)
    return data.replace("%", "%%")


def test_a_forged_control_message_does_not_stop_another_users_job(alice, mallory, agent):
    """A job that reaches Redis (here it is given the address; a deployment's Redis wants a
    password the job does not have) publishes "stop that job" on the victim's node channel,
    speaking the wire protocol itself. Nudges carry nothing the agent trusts: it syncs with the
    portal (over its authenticated transport), which still wants the victim running."""
    victim = _job(alice, agent_node(agent), "sleep 60")
    pid = _running_pid(agent, victim)
    count = [0]
    heard = threading.Event()

    def on_nudge() -> None:
        count[0] += 1
        if count[0] > 1:  # the first call comes with the subscription itself
            heard.set()
        agent.nudge()

    listener = NudgeListener(REDIS_URL, NODE, on_nudge)
    listener.start()
    try:
        deadline = time.monotonic() + 10
        while count[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        forged = [
            json.dumps({"action": "kill", "job_id": victim.pk, "attempt": 1, "signal": 9}),
            json.dumps({"desired": [], "stop": [victim.pk]}),
            f"kill {pid}",
        ]
        url = urlsplit(REDIS_URL)
        wire = "".join(_resp_publish(nudge_channel(NODE), m) for m in forged)
        script = (
            f"exec 3<>/dev/tcp/{url.hostname}/{url.port or 6379}; "
            f"printf {shlex.quote(wire)} >&3; head -c 12 <&3; echo; echo sent=$?"
        )
        attacker = _job(mallory, agent_node(agent), f"bash -c {shlex.quote(script)}")
        attacker = _until_ended(agent, attacker)
        log = _log(agent, attacker)
        assert attacker.state == "COMPLETED" and ":1" in log, log  # the agent heard them
        assert heard.wait(10)
        for _ in range(5):
            agent.step(urgent=True)  # what the nudges trigger: a sync, nothing else
            time.sleep(0.05)
    finally:
        listener.stop()
        listener.join(5)
    assert _alive(pid) and _state(victim) == "RUNNING"
    assert Placement.objects.get(job=victim).active


def test_an_agent_that_is_not_root_refuses_to_run_jobs_as_their_owners(accounts, shared_dir):
    token = shared_dir / "node.token"
    token.write_text("cosn_x\n")
    token.chmod(0o644)
    user = accounts["mallory"]
    base = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups"]
    cli = [sys.executable, "-m", "workers.agent", "--name", "n1", "--portal", "http://127.0.0.1:9"]
    cli += ["--token-file", str(token), "--kind", "cpu"]
    env = {"PATH": os.environ["PATH"], "COSCHED_DATA_DIR": str(shared_dir / "data")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    for extra, expected in (
        (["--run-jobs-as", "owner"], "needs root"),
        (["--run-jobs-as", "cst-alice"], "cannot switch to another account"),
    ):
        result = subprocess.run(
            base + cli + extra, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 2, result.stderr
        assert expected in result.stderr and "Traceback" not in result.stderr
        assert "cst-mallory" in result.stderr


def test_a_memory_limit_holds_for_a_cpu_job(alice, agent):
    """cgroup v2 where the node has it (memory.max); elsewhere the address-space fallback.
    Either way the job cannot hold four times the memory it asked for (``tail -n 1`` keeps a
    line without newlines whole in memory)."""
    hog = "head -c 400000000 /dev/zero | tail -n 1 > /dev/null"
    job = _job(alice, agent_node(agent), hog, memory_mb=100)
    job = _until_ended(agent, job)

    log = _log(agent, job)
    assert job.state == "FAILED", log
    if agent.limits.kind == "cgroup":
        assert job.exit_code == 128 + signal.SIGKILL, log  # the OOM killer, in the cgroup
    else:
        assert "memory exhausted" in log
    fits = "head -c 1000000 /dev/zero | tail -n 1 | wc -c"
    small = _until_ended(agent, _job(alice, agent_node(agent), fits, memory_mb=100))
    assert small.state == "COMPLETED" and "1000000" in _log(agent, small)


def agent_node(agent: NodeAgent) -> Node:
    return Node.objects.get(name=agent.name)


def test_spec_files_carry_the_jobs_account_and_stay_private(alice, agent, accounts):
    job = _job(alice, agent_node(agent), "sleep 30")
    _running_pid(agent, job)
    (attempt,) = list(agent.attempts_dir.iterdir())
    spec = json.loads((attempt / "spec.json").read_text())
    assert spec["isolation"]["account"]["uid"] == accounts["alice"].pw_uid
    assert stat.S_IMODE(attempt.stat().st_mode) == 0o700
    os.kill(agent.job_pid(job.pk), signal.SIGKILL)  # as root: the agent may
    assert _until_ended(agent, job).state == "FAILED"


class _WithJobEnv:
    """The in-process transport, adding variables to every attempt to launch (as a job's
    owner could if the portal let them set the environment)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.inner = InProcessTransport()
        self.env = env

    def sync(self, request):
        reply = self.inner.sync(request)
        desired = tuple(
            dataclasses.replace(s, env={**s.env, **self.env}) if s.launch else s
            for s in reply.desired
        )
        return dataclasses.replace(reply, desired=desired)


def test_the_runner_that_stays_root_takes_nothing_from_the_jobs_environment(
    alice, node, accounts, shared_dir
):
    """The runner keeps the agent's account: a variable of the job's (LD_PRELOAD would load
    the owner's library into a root process) must reach the job only."""
    job_env = {"LD_PRELOAD": "/nonexistent/evil.so", "MALLORY_MARK": "1"}
    agent = _agent(shared_dir, _WithJobEnv(job_env))
    try:
        job = _job(alice, agent_node(agent), "sleep 30")
        pid = _running_pid(agent, job)
        runner = _runner_pid(agent, job)
        runner_env = Path(f"/proc/{runner}/environ").read_bytes().split(b"\0")
        job_environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert b"MALLORY_MARK=1" in job_environ and _uid(pid) == accounts["alice"].pw_uid
        assert not [v for v in runner_env if v.startswith((b"MALLORY_MARK", b"LD_PRELOAD"))]
        assert _uid(runner) == 0
        names = {v.split(b"=", 1)[0] for v in runner_env if v}
        assert b"DATABASE_URL" not in names and b"COSCHED_AGENT_ID" in names
    finally:
        agent.shutdown(kill_jobs=True)
        kill_marked_processes(agent.marker)


def test_a_job_whose_owner_has_no_account_fails_to_launch_and_says_why(django_user_model, agent):
    stranger = django_user_model.objects.create_user("stranger", password="pw-stranger-123")
    job = _until_ended(agent, _job(stranger, agent_node(agent), "echo never"))
    assert job.state == "FAILED"
    assert "portal user 'stranger' has no unix account on this node" in job.failure_reason
    assert "never" not in _log(agent, job).split("\n", 1)[-1]


def test_a_root_agent_starts_in_owner_mode_and_warns_of_a_readable_token(accounts, shared_dir):
    token = shared_dir / "node.token"
    token.write_text("cosn_x\n")
    token.chmod(0o644)
    users_map = shared_dir / "users"
    users_map.write_text("alice cst-alice\n")
    cli = [sys.executable, "-m", "workers.agent", "--name", "n1", "--portal", "http://127.0.0.1:9"]
    cli += ["--token-file", str(token), "--kind", "cpu", "--job-user-map", str(users_map)]
    cli += ["--fallback-account", "cst-mallory", "--interval", "5"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSCHED_")}
    env["COSCHED_DATA_DIR"] = str(shared_dir / "data")
    proc = subprocess.Popen(cli, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "jobs run as their owners' accounts, 1 mapped, else cst-mallory" in lines[1], lines
    assert "cores and memory" in lines[1]
    assert f"the token file {token} is readable by others (chmod 600 it)" in err
    assert proc.returncode == 0, err
