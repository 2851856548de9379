"""The quick chaos run (tests/e2e/chaos.py, ``make chaos`` for the full one): the real stack
with short leases under four faults; nothing lost, nothing run twice or at once, nothing stuck,
every attempt's outcome recorded. And the suite's own bookkeeping of the API's answers, against
a real HTTP server that refuses, times out or answers as scripted: every failed try is counted,
and a row with a failure is not ok."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from portal.core.outbox import CYCLE_PENDING_KEY
from tests.e2e import chaos
from tests.e2e.chaos import CYCLE_MARKER, QUICK, Row, Stack, format_row, run

PORT = 8121  # this suite's port range


def test_the_suite_drops_cycle_messages_through_the_real_marker():
    assert CYCLE_MARKER == CYCLE_PENDING_KEY


class _Portal:
    """A stand-in web server answering POSTs from a script: (status, body) or "hang" (no
    answer before the client gives up). Records each request's Idempotency-Key."""

    def __init__(self, script: list) -> None:
        self.script = list(script)
        self.keys: list[str | None] = []
        portal = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                portal.keys.append(self.headers.get("Idempotency-Key"))
                step = portal.script.pop(0) if portal.script else (500, {"detail": "over"})
                if step == "hang":
                    time.sleep(1.0)
                    return
                status, body = step
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Portal:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stack(tmp_path: Path, monkeypatch) -> Stack:
    monkeypatch.setattr(chaos, "API_TIMEOUT_S", 0.3)
    monkeypatch.setattr(chaos, "SUBMIT_BACKOFF_S", 0.01)
    made = Stack(tmp_path, "postgres://unused/none", QUICK)  # no process is started
    made.url = f"http://127.0.0.1:{PORT}"
    made.token = "t"
    return made


def test_a_refused_or_unanswered_submission_is_retried_with_its_key_and_counted(stack):
    script = [(503, {"detail": "down"}), "hang", (200, {"id": 7})]  # 200: made by the 2nd try
    with _Portal(script) as portal:
        done = stack.submit("j", gpus=0, seconds=1)
    assert done.job == 7 and done.answers == [503, None, 200] and done.retried == 2
    assert len(set(portal.keys)) == 1 and portal.keys[0]  # one key: a retry makes no 2nd job
    row = Row("f")
    assert row.count(done) == 7
    assert row.retried == 2 and row.errors == 0 and row.ok is False  # no recovery measured yet
    row.recover_s = 0.1
    assert row.ok
    line = format_row(row)
    assert "retried after HTTP 503" in line and "no answer" in line, line


def test_a_submission_out_of_tries_is_an_error_and_the_row_is_not_ok(stack):
    with _Portal([(500, {"detail": "boom"})] * chaos.SUBMIT_TRIES):
        done = stack.submit("j", gpus=0, seconds=1)
    assert done.job is None and done.answers == [500] * chaos.SUBMIT_TRIES
    row = Row("f", recover_s=0.1)
    assert row.count(done) is None
    assert row.errors == 1 and row.retried == chaos.SUBMIT_TRIES - 1 and not row.ok
    line = format_row(row)
    assert " FAIL " in line and "ERROR: submit j failed 5 times: HTTP 500" in line, line


def test_a_first_try_success_counts_nothing(stack):
    with _Portal([(201, {"id": 3})]) as portal:
        done = stack.submit("j", gpus=0, seconds=1)
    row = Row("f", recover_s=0.1)
    assert row.count(done) == 3 and done.answers == [201] and len(portal.keys) == 1
    assert row.retried == 0 and row.errors == 0 and row.ok and row.notes == []


@pytest.mark.slow
def test_quick_chaos_loses_nothing_and_runs_nothing_twice_or_at_once():
    rows = run(quick=True)
    assert [r.fault for r in rows] == list(QUICK.faults)
    for row in rows:
        assert row.ok, format_row(row)
        assert row.jobs >= QUICK.jobs and row.recover_s is not None, format_row(row)
        # None of these four faults concerns the web server or the database: every submission
        # is taken at the first try.
        assert row.retried == 0 and row.errors == 0, format_row(row)
    by_fault = {r.fault: r for r in rows}
    # The faults happened and did what they should: the killed agent's jobs were adopted by
    # its successor (no restart); the frozen agent's long jobs were stopped by their runners
    # when the lease ran out and ran again elsewhere, never beside themselves.
    assert by_fault["agent-kill"].restarts == 0, format_row(by_fault["agent-kill"])
    assert by_fault["agent-freeze"].restarts >= 1, format_row(by_fault["agent-freeze"])
    notes = " ".join(by_fault["redis-down"].notes)
    assert "HTTP [201, 200]" in notes and "HTTP 200, process gone after" in notes, notes
