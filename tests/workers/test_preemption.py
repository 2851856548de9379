"""Live preemption and time limits with the real node agent, real runners and real job
processes (the in-process transport carries the protocol's JSON; GPUs are virtual).

A preempted job gets SIGTERM, then SIGKILL after ``COSCHED_STOP_GRACE_S``; its attempt ends
``preempted`` with the reason, the job is placed again, and the emulator resumes from the
checkpoint it saved in ``COSCHED_CHECKPOINT_DIR``. A job past its time limit is stopped the same
way and ends FAILED (time limit)."""

# ruff: noqa: F811  (the agent tests' fixtures, imported below, are test arguments here)

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time

import pytest

from portal.core import scheduling, services
from portal.core.models import Job, JobEvent, Placement
from scheduler.domain import Action, ActionKind, ClusterState, Plan
from tests.workers.test_agent import (  # noqa: F401  (fixtures)
    _alive,
    _attempt,
    _clean_store,
    _job,
    _job_pid,
    _metric,
    _part,
    _proc_state,
    _step_until,
    _wait,
    agent,
    backend,
    node,
    profile,
    transport,
)
from workers.agent import kill_marked_processes

GRACE_S = 1.5


@pytest.fixture(autouse=True)
def _short_grace(settings):
    settings.COSCHED = {**settings.COSCHED, "STOP_GRACE_S": GRACE_S}


def _emulate(extra: str = "") -> str:
    # "toy" runs 20 s alone on an A30: 4 s at --scale 0.2.
    return (
        "exec python -m workers.emulate --profile toy --scale 0.2 --report-every 0.1 "
        f"--checkpoint-every 0.25 {extra}"
    ).strip()


def _checkpoint(agent, job: Job) -> dict | None:
    path = agent.checkpoint_dir(job.pk) / "emulate.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _start_line(agent, job: Job, attempt: int) -> dict:
    """The fields of the emulator's ``start`` report of one attempt, read from the job's log."""
    text = agent.log_path(job.pk).read_text()
    sections = text.split(f"[cosched] job {job.pk} attempt ")
    section = next(s for s in sections if s.startswith(f"{attempt} on "))
    line = next(line for line in section.splitlines() if line.startswith("@cosched start"))
    return dict(item.split("=", 1) for item in line.split()[2:])


def test_a_preempted_emulated_job_is_requeued_and_resumes_from_its_checkpoint(
    client, staff, alice, node, agent, profile
):
    job = _job(alice, node, _emulate(), profile=profile)
    pid = _job_pid(agent, job)
    saved = _wait(
        lambda: agent.step() and (c := _checkpoint(agent, job)) and c["fraction"] >= 0.3 and c,
        what="a checkpoint past 30 %",
    )
    assert saved["attempt"] == "1" and saved["profile"] == "toy"

    reason = "gavel-like policy: job 77 gains 2.1x on this A30"
    services.job_preempt(Job.objects.get(pk=job.pk), actor="scheduler", reason=reason)
    job.refresh_from_db()
    assert job.state == "PENDING" and job.requeue_count == 1
    attempt1 = Placement.objects.get(job=job, attempt=1)
    assert (attempt1.outcome, attempt1.end_reason, attempt1.active) == ("preempted", reason, False)

    # The agent stops it (SIGTERM: the emulator saves its progress and exits 143).
    _wait(lambda: agent.step() and not _alive(pid), what="the preempted process to end")
    _wait(lambda: agent.step() and _part(job, 1).settled_at is not None, what="attempt 1 settled")
    part = _part(job, 1)
    assert part.outcome == "killed" and part.exit_code == 143  # its own SIGTERM exit, no SIGKILL
    at_stop = _checkpoint(agent, job)["fraction"]
    assert at_stop >= saved["fraction"]
    log = agent.log_path(job.pk).read_text()
    assert "@cosched term" in log and "@cosched checkpoint" in log

    # Placed again by a real scheduling cycle (fifo), then launched as attempt 2.
    result = scheduling.run_cycle(seed=1)
    assert result.placed == [job.pk]
    job = _step_until(agent, job, "COMPLETED", "FAILED", timeout=30)
    assert job.state == "COMPLETED" and job.exit_code == 0

    start = _start_line(agent, job, 2)
    assert float(start["resumed_from"]) == pytest.approx(at_stop, abs=1e-6)  # not restarted
    assert float(_start_line(agent, job, 1)["resumed_from"]) == 0.0
    assert _checkpoint(agent, job)["attempt"] == "2"  # COSCHED_ATTEMPT reached the job
    # The live Slow-Down of attempt 2 counts only the work left to it (never far below 1).
    slowdown = _metric("slowdown", job=job)
    assert slowdown and min(slowdown) >= 0.85, slowdown

    # Both attempts in the API and on the page, the first with why it was preempted.
    client.force_login(alice)
    attempts = client.get(f"/api/v1/jobs/{job.pk}/").json()["attempts"]
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [
        (1, "preempted"),
        (2, "completed"),
    ]
    assert attempts[0]["end_reason"] == reason
    assert attempts[0]["gpus"] == [f"{node.name}/0"] and attempts[0]["nodes"] == [node.name]
    assert attempts[0]["started_at"] and attempts[0]["ended_at"]
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert reason in page and "Preempted" in page and 'class="attempt-preempted"' in page
    assert 'id="preempt-form"' not in page  # alice is not staff, and the job has finished


class _RequeueRunning:
    """A stand-in policy that preempts every running job (as a Gavel-like policy would)."""

    name = "requeue-all"

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        return Plan(
            actions=tuple(
                Action(ActionKind.REQUEUE, r.job.id, self.name, "a better assignment frees 40 s")
                for r in state.running
            )
        )


def test_a_policy_requeue_action_preempts_the_live_job(alice, node, agent, monkeypatch, tmp_path):
    marker = tmp_path / "got-term"
    job = _job(alice, node, f"trap 'touch {marker}; exit 0' TERM; sleep 30 & wait")
    pid = _job_pid(agent, job)
    agent.step()
    monkeypatch.setattr(scheduling, "build_policy", lambda name, params: _RequeueRunning())

    result = scheduling.run_cycle(seed=1)

    assert result.actions == [("requeue", job.pk)]
    job.refresh_from_db()
    assert job.state == "PENDING"
    attempt = Placement.objects.get(job=job, attempt=1)
    assert attempt.outcome == "preempted"
    assert attempt.end_reason == "requeue-all: a better assignment frees 40 s"
    event = JobEvent.objects.filter(job=job, to_state="PENDING").get()
    assert event.actor == "scheduler" and "preempted: requeue-all" in event.message
    _wait(lambda: agent.step() and not _alive(pid), what="the process to end")
    assert marker.exists()  # it got SIGTERM, its chance to checkpoint
    _wait(lambda: agent.step() and _part(job).settled_at is not None, what="the result")
    assert _part(job).outcome == "killed"


def test_a_job_ignoring_sigterm_is_killed_after_the_grace(staff_api, alice, node, agent):
    job = _job(alice, node, "trap '' TERM; sleep 60")
    pid = _job_pid(agent, job)
    agent.step()

    response = staff_api.post(f"/api/v1/jobs/{job.pk}/preempt/", {"reason": "drain"}, "json")
    assert response.status_code == 200 and response.json()["state"] == "PENDING"
    asked = time.monotonic()
    agent.step()  # the runner sends SIGTERM, which the job ignores
    time.sleep(GRACE_S / 3)
    assert _alive(pid) and _proc_state(pid) != "Z"
    _wait(lambda: agent.step() and not _alive(pid), timeout=GRACE_S + 10, what="SIGKILL")
    assert time.monotonic() - asked >= GRACE_S * 0.9
    _wait(lambda: agent.step() and _part(job).settled_at is not None, what="the result")
    part = _part(job)
    assert part.outcome == "killed" and part.exit_code == -9 and "SIGKILL" in part.detail
    assert part.placement.outcome == "preempted" and part.placement.end_reason == "drain"


def test_a_job_past_its_time_limit_is_stopped_and_fails_with_reason_time_limit(alice, node, agent):
    job = _job(alice, node, "echo working; sleep 60")
    Job.objects.filter(pk=job.pk).update(time_limit_s=1)
    pid = _job_pid(agent, job)
    started = time.monotonic()
    job = _step_until(agent, job, "FAILED", "COMPLETED", timeout=20)
    took = time.monotonic() - started
    assert not _alive(pid)
    assert job.state == "FAILED" and job.end_label == "time limit"
    assert job.failure_reason.startswith("time limit 00:00:01 reached")
    assert job.exit_code == -15  # sleep ended by the SIGTERM
    assert 0.9 <= took < 10
    part = _part(job)
    assert part.outcome == "time_limit" and part.placement.outcome == "failed"


def test_a_job_ignoring_sigterm_at_its_time_limit_is_killed_after_the_grace(alice, node, agent):
    job = _job(alice, node, "trap '' TERM; sleep 60")
    Job.objects.filter(pk=job.pk).update(time_limit_s=1)
    _job_pid(agent, job)
    started = time.monotonic()
    job = _step_until(agent, job, "FAILED", "COMPLETED", timeout=20)
    assert time.monotonic() - started >= 1 + GRACE_S * 0.9
    assert job.exit_code == -9 and "SIGKILL" in job.failure_reason
    assert job.end_label == "time limit"


def test_paused_time_does_not_count_toward_the_time_limit(alice, node, agent):
    job = _job(alice, node, "sleep 60")
    Job.objects.filter(pk=job.pk).update(time_limit_s=2)
    pid = _job_pid(agent, job)
    services.job_pause(Job.objects.get(pk=job.pk), actor="user:alice")
    _wait(lambda: agent.step() and _proc_state(pid) == "T", what="SIGSTOP")
    time.sleep(3)  # longer than the limit, all of it paused
    agent.step()
    assert _alive(pid) and Job.objects.get(pk=job.pk).state == "PAUSED"
    services.job_resume(Job.objects.get(pk=job.pk), actor="user:alice")
    job = _step_until(agent, job, "FAILED", "COMPLETED", timeout=20)
    assert job.end_label == "time limit"


def test_the_next_attempt_waits_until_the_preempted_one_has_stopped(alice, node, agent, tmp_path):
    """Placed again at once (the job is PENDING the moment it is preempted), attempt 2 is not
    launched while attempt 1 still runs out its grace: one running attempt at a time."""
    out = tmp_path / "attempts"
    command = (
        f'echo "$COSCHED_ATTEMPT $COSCHED_TIME_LIMIT_S $COSCHED_CHECKPOINT_DIR" >> {out}; '
        "trap '' TERM; sleep 60"
    )
    job = _job(alice, node, command)
    Job.objects.filter(pk=job.pk).update(time_limit_s=600)
    pid1 = _job_pid(agent, job)
    agent.step()
    services.job_preempt(Job.objects.get(pk=job.pk), actor="scheduler", reason="test")
    assert scheduling.run_cycle(seed=1).placed == [job.pk]  # attempt 2, at once

    deadline = time.monotonic() + GRACE_S * 0.8
    while time.monotonic() < deadline:  # attempt 1 ignores SIGTERM and runs out its grace
        agent.step()
        assert _alive(pid1)
        assert [k.attempt for k in agent.running()] == [1]  # attempt 2 not started
        time.sleep(0.1)
    _wait(lambda: agent.step() and [k.attempt for k in agent.running()] == [2], what="attempt 2")
    assert not _alive(pid1)
    job = _step_until(agent, job, "RUNNING")
    first, second = _part(job, 1), _part(job, 2)
    assert first.outcome == "killed" and first.exit_code == -9
    assert second.started_at >= first.settled_at
    lines = _wait(lambda: len(out.read_text().splitlines()) == 2 and out.read_text().splitlines())
    checkpoint_dir = str(agent.checkpoint_dir(job.pk))
    assert lines == [f"1 600 {checkpoint_dir}", f"2 600 {checkpoint_dir}"]


def test_a_preempted_gang_stops_every_rank_before_it_runs_again(alice, tmp_path):
    """Preemption is generic: a gang's ranks on two nodes all get SIGTERM, and the next
    attempt starts on no node until every rank of the preempted one has stopped."""
    from tests.workers import test_gang

    agents = _gang_agents(tmp_path)
    try:
        job = test_gang._gang(alice, "trap 'sleep 0.5; exit 0' TERM; sleep 60 & wait")
        pids = test_gang._pids(agents, job)
        test_gang._until(agents, lambda: test_gang._state(job) == "RUNNING", what="the gang")
        services.job_preempt(Job.objects.get(pk=job.pk), actor="quota", reason="reclaim")
        assert scheduling.run_cycle(seed=1).placed == [job.pk]  # placed again at once
        test_gang._until(
            agents,
            lambda: (
                not any(_alive(p) for p in pids)
                or any(k.attempt == 2 for a in agents for k in a.running())
            ),
            what="the ranks of attempt 1 to stop",
        )
        assert not any(_alive(p) for p in pids)  # no rank of attempt 2 before that
        test_gang._until(
            agents,
            lambda: sorted(k.attempt for a in agents for k in a.running()) == [2, 2],
            what="both ranks of attempt 2",
        )
        first = Placement.objects.get(job=job, attempt=1)
        assert first.outcome == "preempted" and first.end_reason == "reclaim"
        settled = [p.settled_at for p in first.parts.all()]
        started = [p.started_at for p in Placement.objects.get(job=job, attempt=2).parts.all()]
        assert all(settled) and all(started) and min(started) >= max(settled)
    finally:
        for a in agents:
            a.shutdown(kill_jobs=True)
            kill_marked_processes(a.marker)


def _gang_agents(tmp_path) -> list:
    """The two nodes and agents of ``tests/workers/test_gang.py`` (its fixture, made here)."""
    from portal.core.agent_sync import InProcessTransport
    from portal.core.models import Gpu, Node
    from scheduler.catalog import gpu_spec
    from tests.workers.test_gang import NODES
    from workers.agent import NodeAgent
    from workers.gpu.virtual_backend import VirtualBackend

    made = []
    for i, name in enumerate(NODES):
        node = Node.objects.create(name=name, kind="gpu", cores=8, address=f"10.0.0.{i + 1}")
        for index in range(2):
            Gpu.objects.create(
                node=node, index=index, model="V100", memory_mb=gpu_spec("V100").memory_mb
            )
        made.append(
            NodeAgent(
                name,
                VirtualBackend("V100x2", node=name),
                InProcessTransport(),
                cores=8,
                data_dir=tmp_path / name,
                address=f"10.0.0.{i + 1}",
                sample_every_s=0.0,
            )
        )
    return made


# --- no process outlives its attempt (issue 29) -------------------------------------------------


@pytest.fixture
def escaped(tmp_path):
    """A pid file for a job's grandchild that leaves its session; killed at the end whatever
    happens (a failing test must not leave it looping)."""
    pidfile = tmp_path / "escaped.pid"
    yield pidfile
    with contextlib.suppress(OSError, ValueError):
        os.kill(int(pidfile.read_text()), signal.SIGKILL)


@pytest.mark.parametrize("how", ["preempt", "cancel"])
def test_a_grandchild_that_left_the_session_ends_with_its_attempt(alice, node, agent, escaped, how):
    """``setsid sh -c 'while true ...' &``: its own session and process group, so signals to
    the job's group miss it; the runner, its subreaper, stops it all the same, and the attempt
    settles only once it is gone, so it never runs beside attempt 2 (no cgroup on this host
    is assumed)."""
    loop = f"setsid sh -c 'echo $$ > {escaped}; while true; do sleep 0.2; done' & "
    job = _job(alice, node, loop + "sleep 60")
    pid = _job_pid(agent, job)
    grandchild = int(
        _wait(lambda: agent.step() and escaped.exists() and escaped.read_text().strip(), what="pid")
    )
    assert os.getsid(grandchild) == grandchild != os.getsid(pid)  # it really left the session
    job = Job.objects.get(pk=job.pk)
    if how == "preempt":
        services.job_preempt(job, actor="staff:test", reason="drain")
    else:
        services.job_cancel(job, actor="alice")
    _wait(lambda: agent.step() and _part(job, 1).settled_at is not None, what="attempt 1 settled")
    assert not _alive(pid)
    assert not _alive(grandchild), f"the escaped grandchild {grandchild} outlived attempt 1"
    if how == "preempt":
        assert scheduling.run_cycle(seed=1).placed == [job.pk]
        _job_pid(agent, job)  # attempt 2 runs, alone
        assert Job.objects.get(pk=job.pk).state == "RUNNING"
        assert not _alive(grandchild)
        services.job_cancel(Job.objects.get(pk=job.pk), actor="alice")
        _wait(lambda: agent.step() and _part(job, 2).settled_at is not None, what="attempt 2")


def test_a_preempted_attempt_ends_when_its_process_died_not_when_asked(
    staff_api, alice, node, agent
):
    """A job that ignores SIGTERM dies at SIGKILL, a grace after the preemption: the attempt's
    ``ended_at`` (API) is then, not the moment the preemption was decided."""
    job = _job(alice, node, "trap '' TERM; while true; do sleep 0.1; done")
    pid = _job_pid(agent, job)
    agent.step()
    response = staff_api.post(f"/api/v1/jobs/{job.pk}/preempt/", {"reason": "drain"}, "json")
    assert response.status_code == 200
    decided = Placement.objects.get(job=job, attempt=1).released_at
    _wait(lambda: agent.step() and not _alive(pid), timeout=GRACE_S + 10, what="SIGKILL")
    _wait(lambda: agent.step() and _part(job).settled_at is not None, what="the result")
    part = _part(job)
    assert part.exit_code == -9
    ended = Placement.objects.get(job=job, attempt=1).released_at
    assert (ended - decided).total_seconds() >= GRACE_S * 0.9
    assert ended <= part.reported_at
    attempts = staff_api.get(f"/api/v1/jobs/{job.pk}/").json()["attempts"]
    assert attempts[0]["ended_at"] == ended.isoformat().replace("+00:00", "Z")
