"""The job runner (workers.runner) as a real process: it starts the job, records how it ended,
stops it on request, and stops it by itself when the node's lease runs out."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from workers import runner as r

ROOT = Path(__file__).resolve().parents[2]


def _wait(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Attempt:
    """An attempt directory with its spec, a lease file, and the runner started on it."""

    def __init__(
        self, tmp: Path, command: str, lease_s: float = 60.0, grace_s: float = 1.0, **extra
    ):
        self.dir = tmp / "attempt"
        self.dir.mkdir()
        self.lease = tmp / "lease.json"
        self.log = tmp / "job.log"
        self.renew(lease_s, grace_s)
        r.write_json(
            self.dir / r.SPEC,
            {
                "argv": ["/bin/sh", "-c", command],
                "env": {"PATH": os.environ["PATH"], "MARK": "runner-test"},
                "cwd": str(tmp / "work"),
                "log": str(self.log),
                "lease_file": str(self.lease),
                "lease_deadline": r.lease_clock() + lease_s,
                "ack_wait_s": 0,  # leave at once (the tests below say otherwise)
                **extra,
            },
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-S", "-m", "workers.runner", str(self.dir)],
            env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)},
            start_new_session=True,
        )

    def renew(self, lease_s: float, grace_s: float = 1.0) -> None:
        r.write_json(self.lease, {"deadline": r.lease_clock() + lease_s, "kill_grace_s": grace_s})

    def job_pid(self) -> int:
        return _wait(lambda: (r.read_json(self.dir / r.JOB) or {}).get("pid"), what="job.json")

    def result(self, timeout: float = 15.0) -> dict:
        assert self.proc.wait(timeout) == 0
        return r.read_json(self.dir / r.RESULT)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        job = r.read_json(self.dir / r.JOB)
        if job:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job["pid"], signal.SIGKILL)


@pytest.fixture
def attempts(tmp_path):
    made: list[Attempt] = []

    def make(command: str, **kw) -> Attempt:
        a = Attempt(tmp_path, command, **kw)
        made.append(a)
        return a

    yield make
    for a in made:
        a.close()


def test_it_records_the_exit_status_and_the_output(attempts):
    a = attempts("echo out; echo err >&2; exit 3")
    result = a.result()
    assert (result["outcome"], result["exit_code"], result["detail"]) == (
        "exited",
        3,
        "exit code 3",
    )
    assert result["ended_at"] >= result["started_at"]
    assert a.log.read_text() == "out\nerr\n"
    runner = r.read_json(a.dir / r.RUNNER)
    assert runner["pid"] == a.proc.pid and runner["start_ticks"] > 0


def test_a_stop_request_kills_the_jobs_whole_group(attempts):
    a = attempts("sleep 60 & sleep 60; wait")
    pid = a.job_pid()
    r.write_json(a.dir / r.STOP, {"outcome": "killed", "detail": "cancelled", "grace_s": 5})
    os.kill(a.proc.pid, signal.SIGTERM)
    result = a.result()
    assert result["outcome"] == "killed"
    assert result["detail"] == "cancelled (killed by SIGTERM)"
    assert not r.group_alive(pid)


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace(attempts):
    a = attempts("trap '' TERM; echo ready; sleep 60")
    a.job_pid()
    _wait(lambda: "ready" in a.log.read_text(), what="the trap")
    started = time.monotonic()
    r.write_json(a.dir / r.STOP, {"outcome": "killed", "detail": "x", "grace_s": 0.5})
    os.kill(a.proc.pid, signal.SIGTERM)
    result = a.result()
    assert result["exit_code"] == -signal.SIGKILL
    assert 0.4 <= time.monotonic() - started < 5


def test_the_job_is_stopped_when_the_lease_runs_out(attempts):
    a = attempts("sleep 60", lease_s=1.0, grace_s=0.5)
    pid = a.job_pid()
    deadline = r.lease_deadline(str(a.lease), 0.0)[0]
    result = a.result()
    assert result["outcome"] == "lease_expired" and "lease ran out" in result["detail"]
    assert r.lease_clock() >= deadline
    assert not r.group_alive(pid)


def test_a_renewed_lease_keeps_the_job_running(attempts):
    a = attempts("sleep 1.5; exit 0", lease_s=0.6)
    a.job_pid()
    for _ in range(6):
        time.sleep(0.3)
        a.renew(0.6)
    result = a.result()
    assert (result["outcome"], result["exit_code"]) == ("exited", 0)


def test_a_lease_already_run_out_starts_nothing(attempts):
    a = attempts("echo should-not-run", lease_s=-1.0)
    result = a.result()
    assert result["outcome"] == "lease_expired" and result["exit_code"] is None
    assert not a.log.exists() and r.read_json(a.dir / r.JOB) is None


def test_a_command_that_cannot_start_is_a_launch_failure(attempts, tmp_path):
    a = attempts("true")
    a.proc.wait(10)
    spec = r.read_json(a.dir / r.SPEC)
    spec["argv"] = [str(tmp_path / "no-such-program")]
    r.write_json(a.dir / r.SPEC, spec)
    (a.dir / r.RESULT).unlink()
    again = subprocess.run(
        [sys.executable, "-S", "-m", "workers.runner", str(a.dir)],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)},
        timeout=30,
    )
    assert again.returncode == 0
    result = r.read_json(a.dir / r.RESULT)
    assert result["outcome"] == "launch_failed" and "no-such-program" in result["detail"]


def test_the_runner_survives_a_kill_of_its_starter(tmp_path):
    """Started in its own session, the runner is no child of the agent's process group."""
    a = Attempt(tmp_path, "sleep 0.5; exit 7")
    try:
        assert os.getsid(a.proc.pid) == a.proc.pid != os.getsid(0)
        job = a.job_pid()
        assert os.getsid(job) == job  # the job too leads its own session
        assert a.result()["exit_code"] == 7
    finally:
        a.close()


def test_it_stays_until_the_agent_forgets_the_attempt_and_wakes_it_first(tmp_path):
    fifo = tmp_path / "wake.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    a = Attempt(tmp_path, "exit 0", ack_wait_s=60, wake_fifo=str(fifo))
    try:
        _wait(lambda: (a.dir / r.RESULT).exists(), what="the result")
        _wait(lambda: _read(reader) == b"r", what="the wake byte")
        time.sleep(0.5)
        assert a.proc.poll() is None  # waiting for the acknowledgement
        for f in a.dir.iterdir():
            f.unlink()
        a.dir.rmdir()  # what the agent does once the portal acknowledged the result
        assert a.proc.wait(5) == 0
    finally:
        os.close(reader)
        a.close()


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 16)
    except BlockingIOError:
        return b""


def test_it_reports_the_result_itself_when_the_agent_does_not(tmp_path):
    """The agent frozen: after ``report_after_s`` the runner posts a ResultReport with the
    node's token to the portal (here a recording HTTP server) and leaves."""
    import http.server
    import json as jsonlib

    received: list[tuple[str, str, dict]] = []

    class Portal(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = jsonlib.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append((self.path, self.headers["Authorization"], body))
            answer = jsonlib.dumps({"version": 1, "acked": [{"job_id": 5, "attempt": 2}]})
            self.send_response(200 if len(received) > 1 else 503)  # the first try fails
            self.end_headers()
            self.wfile.write(answer.encode())

        def log_message(self, *args) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Portal)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "node.token"
    token.write_text("cosn_secret\n")
    report = {
        "url": f"http://127.0.0.1:{server.server_port}/portal",
        "path": "/agent/v1/results",
        "token_file": str(token),
        "node": "gpu-7",
        "job_id": 5,
        "attempt": 2,
    }
    a = Attempt(tmp_path, "exit 4", ack_wait_s=60, report=report, report_after_s=0.3)
    try:
        assert a.proc.wait(20) == 0
    finally:
        server.shutdown()
        a.close()
    assert len(received) == 2  # retried after the 503
    path, auth, body = received[-1]
    assert path == "/portal/agent/v1/results" and auth == "Bearer cosn_secret"
    assert body["node"] == "gpu-7" and body["version"] == 1
    (result,) = body["results"]
    assert (result["job_id"], result["attempt"], result["outcome"]) == (5, 2, "exited")
    assert result["exit_code"] == 4 and result["detail"] == "exit code 4"
    assert (a.dir / r.REPORTED).exists() and (a.dir / r.RESULT).exists()


def test_describe_status():
    assert r.describe_status(0) == "exit code 0"
    assert r.describe_status(-9) == "killed by SIGKILL"
    assert r.describe_status(137) == "exit code 137 (SIGKILL)"
    assert r.describe_status(None) == "no exit status"


def test_is_alive_tells_a_reused_pid_from_the_process():
    me = os.getpid()
    ticks = r.start_ticks(me)
    assert r.is_alive(me, ticks)
    assert not r.is_alive(me, ticks + 1)
    assert not r.is_alive(None, ticks)


# -- one process per rank (elastic jobs: one per GPU) ---------------------------------------------


def test_ranks_each_get_their_own_environment_and_all_must_finish(attempts, tmp_path):
    out = tmp_path / "ranks"
    out.mkdir()
    a = attempts(
        f'sleep 0.$RANK; echo "$RANK $CUDA_VISIBLE_DEVICES $MARK" > {out}/$RANK',
        ranks=[{"RANK": str(i), "CUDA_VISIBLE_DEVICES": str(4 + i)} for i in range(3)],
    )
    result = a.result()
    assert (result["outcome"], result["exit_code"]) == ("exited", 0)
    assert sorted(p.read_text() for p in out.iterdir()) == [
        "0 4 runner-test\n",
        "1 5 runner-test\n",
        "2 6 runner-test\n",
    ]
    job = r.read_json(a.dir / r.JOB)
    assert len(job["pgids"]) == 3 and job["pgids"][0] == job["pid"]


def test_one_failing_rank_stops_the_others_and_is_the_jobs_status(attempts):
    a = attempts(
        'if [ "$RANK" = 1 ]; then sleep 0.3; exit 7; fi; exec sleep 60',
        ranks=[{"RANK": str(i)} for i in range(3)],
        time_limit_grace_s=2,
    )
    job = _wait(lambda: r.read_json(a.dir / r.JOB), what="job.json")
    result = a.result(timeout=20)
    assert (result["outcome"], result["exit_code"]) == ("exited", 7)
    assert "rank 1 of 3" in result["detail"]
    assert not any(r.group_alive(pgid) for pgid in job["pgids"])


def test_a_stop_request_reaches_every_rank(attempts):
    a = attempts("exec sleep 60", ranks=[{"RANK": str(i)} for i in range(2)])
    job = _wait(lambda: r.read_json(a.dir / r.JOB), what="job.json")
    r.write_json(a.dir / r.STOP, {"outcome": "killed", "detail": "regrouped", "grace_s": 5})
    os.kill(a.proc.pid, signal.SIGTERM)
    result = a.result()
    assert result["outcome"] == "killed" and result["detail"].startswith("regrouped")
    assert not any(r.group_alive(pgid) for pgid in job["pgids"])


# --- no process outlives its attempt --------------------------------------------------------------

# A grandchild that leaves the job's session (and process group): ``setsid`` starts it as the
# leader of a new session; it writes its pid, then loops for ever.
ESCAPE = "setsid sh -c 'echo $$ > {pidfile}; while true; do sleep 0.2; done' & "


def _escaped_pid(pidfile: Path) -> int:
    return int(_wait(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the pid"))


def _gone(pid: int) -> bool:
    fields = r._stat_fields(pid)
    return not fields or fields[0] in ("Z", "X")


@pytest.mark.parametrize("how", ["stop", "exit", "time_limit"])
def test_a_grandchild_that_left_the_session_goes_with_the_attempt(attempts, tmp_path, how):
    pidfile = tmp_path / "escaped.pid"
    command = ESCAPE.format(pidfile=pidfile) + ("sleep 1" if how == "exit" else "sleep 60")
    extra = {"time_limit_s": 1.0, "time_limit_grace_s": 0.5} if how == "time_limit" else {}
    a = attempts(command, **extra)
    job = a.job_pid()
    escaped = _escaped_pid(pidfile)
    # It really left: its own session and group, not the job's.
    assert os.getsid(escaped) == escaped and os.getpgid(escaped) != job
    if how == "stop":
        r.write_json(a.dir / r.STOP, {"outcome": "stopped", "detail": "preempted", "grace_s": 2})
        os.kill(a.proc.pid, signal.SIGTERM)
    result = a.result()
    expected = {"stop": "stopped", "exit": "exited", "time_limit": "time_limit"}[how]
    assert result["outcome"] == expected
    # Gone when the result is written, not later: the runner swept it first.
    assert _gone(escaped), f"pid {escaped} outlived its attempt"
    # After a plain exit nobody signalled it: the runner's sweep found it, and says so in the
    # log (after a stop it got the SIGTERM with the job, and may be gone before the sweep).
    assert how != "exit" or "left when the job ended: killed" in a.log.read_text()


def test_an_orphan_reparented_to_the_runner_is_reaped_while_the_job_runs(attempts, tmp_path):
    """The runner is the subreaper: a double-forked child's parent becomes the runner, which
    collects it when it exits (no zombie left behind)."""
    pidfile = tmp_path / "orphan.pid"
    a = attempts(f"(sh -c 'echo $$ > {pidfile}; sleep 0.5' &) ; sleep 60")
    a.job_pid()
    orphan = _escaped_pid(pidfile)
    assert _wait(lambda: int(r._stat_fields(orphan)[1]) == a.proc.pid, what="re-parenting")
    _wait(lambda: r._stat_fields(orphan) is None, what="the orphan reaped")
    r.write_json(a.dir / r.STOP, {"outcome": "killed", "detail": "cancelled", "grace_s": 1})
    os.kill(a.proc.pid, signal.SIGTERM)
    assert a.result()["outcome"] == "killed"


def test_ended_at_is_when_the_last_process_died(attempts, tmp_path):
    """A job that ignores SIGTERM dies at the grace's SIGKILL; ``ended_at`` is after that, not
    when the stop was asked. Its escaped grandchild ignores SIGTERM too, and goes as well."""
    pidfile = tmp_path / "escaped.pid"
    escape = (
        f"setsid sh -c 'trap \"\" TERM; echo $$ > {pidfile}; while true; do sleep 0.2; done' & "
    )
    a = attempts(escape + "trap '' TERM; echo ready; while true; do sleep 0.2; done")
    a.job_pid()
    escaped = _escaped_pid(pidfile)
    _wait(lambda: "ready" in a.log.read_text(), what="the trap")
    asked = time.time()
    r.write_json(a.dir / r.STOP, {"outcome": "stopped", "detail": "preempted", "grace_s": 1.5})
    os.kill(a.proc.pid, signal.SIGTERM)
    time.sleep(0.5)
    assert not _gone(escaped)  # SIGTERM ignored: still there within the grace
    result = a.result()
    assert _gone(escaped)
    assert result["exit_code"] == -signal.SIGKILL
    assert result["ended_at"] >= asked + 1.5
