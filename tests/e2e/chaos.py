"""The chaos suite: the real stack under faults, checked for lost, repeated and concurrent runs.

    python -m tests.e2e.chaos [--quick] [--fault NAME ...]      (make chaos)

Stack, every part a real process: PostgreSQL (a scratch database of its own), a private
``redis-server`` on its own port (so it can be stopped and come back empty), gunicorn (2
workers), two Celery workers on the ``scheduler`` queue (solo pool: a kill -9 kills the cycle
in hand), beat, and three node agents (``python -m workers.agent``, virtual GPUs: two nodes of 2
Titan Xp, one CPU node), each holding only its node token.

Every job is a shell command that writes a **side-effect record** per start and per end
(``<effects>/<job>/start.<attempt>.<pid>`` and ``end...``, with the time) and sleeps in between;
a watcher thread reads ``/proc`` ten times a second and notes every job process alive (by its
``COSCHED_JOB_ID`` / ``COSCHED_ATTEMPT``). Per fault, a batch of jobs is submitted through the
API, the fault is injected while they run, a probe job measures how long until a new job runs,
and then:

- **lost**: a job that did not end as it should (COMPLETED; CANCELLED where the suite cancelled
  it) or that the database says COMPLETED without an end record;
- **ran twice**: a job with two end records (its work done twice);
- **ran concurrently**: two attempts of one job alive at the same moment (the watcher), or
  overlapping start..end records;
- **stuck**: a job not finished when the batch's deadline passed;
- **unrecorded**: an attempt that started but whose outcome no agent ever reported;
- **restarts**: attempts beyond the first (a job stopped by a fault and run again; allowed);
- **recover s**: from the end of the fault to a probe job submitted then reaching RUNNING;
- **retried**: submissions the API refused (non-2xx) or left unanswered (timeout, connection
  cut), each tried again with the same ``Idempotency-Key`` (so a retry never makes a second
  job); every failed try counts, and a note gives its status;
- **errors**: API calls that failed for good (a submission out of tries, a cancel that was not
  answered 200) and faults that did not do what they must (a frozen node never marked down, a
  job cancelled during the Redis outage whose process outlived it). A row with errors, or
  without a recovery time, is not ok.

Faults: ``scheduler-kill`` (kill -9 of a scheduler worker mid-cycle, restarted), ``agent-kill``
(kill -9 of the agent running the most jobs, restarted: it adopts them), ``redis-down`` (Redis
stopped; submit and cancel meanwhile; back empty), ``messages-dropped`` (every nudge lost, the
first scheduling messages deleted from the queue), ``pg-kill`` (``pg_terminate_backend`` of every
connection, repeatedly), ``agent-freeze`` (SIGSTOP of an agent for longer than its lease, then
SIGCONT). ``--quick`` uses short leases and a subset (the e2e test ``test_chaos.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ALL_FAULTS = (
    "scheduler-kill",
    "agent-kill",
    "redis-down",
    "messages-dropped",
    "pg-kill",
    "agent-freeze",
)
AGENTS = {"chaos-gpu-1": "TitanXpx2", "chaos-gpu-2": "TitanXpx2", "chaos-cpu": None}
CYCLE_MARKER = "cosched:cycle-queued"  # portal.core.outbox.CYCLE_PENDING_KEY (no Django here)
SUBMIT_TRIES = 5  # a refused or unanswered submission is tried again, after 0.5, 1, 2, 4 s
SUBMIT_BACKOFF_S = 0.5
API_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Config:
    """Timings of one run (seconds)."""

    lease_s: float
    margin_s: float
    sync_s: float
    reconcile_s: float
    cycle_s: float
    jobs: int
    job_s: float
    redis_down_s: float
    agent_down_s: float
    faults: tuple[str, ...]

    @property
    def freeze_s(self) -> float:
        """Longer than the lease, the margin and a reconciliation: the node is lost."""
        return self.lease_s + self.margin_s + 2 * self.reconcile_s + 3


FULL = Config(
    lease_s=20,
    margin_s=10,
    sync_s=1,
    reconcile_s=2,
    cycle_s=10,
    jobs=12,
    job_s=8,
    redis_down_s=45,
    agent_down_s=5,
    faults=ALL_FAULTS,
)
QUICK = Config(
    lease_s=4,
    margin_s=2,
    sync_s=0.5,
    reconcile_s=0.5,
    cycle_s=2,
    jobs=4,
    job_s=2.5,
    redis_down_s=6,
    agent_down_s=0.5,
    faults=("agent-kill", "agent-freeze", "redis-down", "messages-dropped"),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


# --- processes ------------------------------------------------------------------------------------


@dataclass
class Proc:
    """One server process of the stack, restartable with the same command."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def stop(self, timeout: float = 15) -> None:
        if not self.alive():
            return
        assert self.popen is not None
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait(10)

    def kill9(self) -> None:
        """SIGKILL of the process itself (not its group: an agent's runners live on)."""
        if self.alive():
            assert self.popen is not None
            os.kill(self.pid, signal.SIGKILL)
            self.popen.wait(10)

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Stack:
    """The stack described in the module docstring, on its own database, Redis and files."""

    def __init__(self, tmp: Path, database_url: str, cfg: Config) -> None:
        self.tmp = tmp
        self.cfg = cfg
        self.database_url = database_url
        self.redis_port = free_port()
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.web_port = free_port()
        self.url = f"http://127.0.0.1:{self.web_port}"
        self.data = tmp / "data"
        self.effects = tmp / "effects"
        self.effects.mkdir(parents=True, exist_ok=True)
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("COSCHED_", "DJANGO_", "CELERY_"))
            and k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "TEST_DB_NAME")
        }
        base["PYTHONUNBUFFERED"] = "1"
        self.portal_env = {
            **base,
            "DATABASE_URL": database_url,
            "REDIS_URL": self.redis_url,
            "SECRET_KEY": secrets.token_urlsafe(40),
            "DEBUG": "0",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "SECURE_SSL_REDIRECT": "0",
            "STATIC_ROOT": str(tmp / "static"),
            "LOG_LEVEL": "INFO",
            "COSCHED_DATA_DIR": str(self.data),
            "COSCHED_LEASE_S": str(cfg.lease_s),
            "COSCHED_LEASE_MARGIN_S": str(cfg.margin_s),
            "COSCHED_SYNC_INTERVAL_S": str(cfg.sync_s),
            "COSCHED_RECONCILE_EVERY_S": str(cfg.reconcile_s),
            "COSCHED_CYCLE_EVERY_S": str(cfg.cycle_s),
        }
        # An agent holds its token, the portal's URL and where to hear nudges: nothing else.
        self.agent_env = {**base, "COSCHED_DATA_DIR": str(self.data), "LOG_LEVEL": "INFO"}
        self.procs: dict[str, Proc] = {}
        self.token = ""

    # -- life cycle ------------------------------------------------------------------------------

    def _proc(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        proc = Proc(name, argv, env, self.tmp / f"{name}.log")
        self.procs[name] = proc
        return proc

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.portal_env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode:
            raise RuntimeError(f"manage.py {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout

    def start(self) -> None:
        self._proc(
            "redis",
            ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--protected-mode", "no"],
            self.portal_env,
        ).start()  # fmt: skip
        self.manage("migrate", "--noinput", "--verbosity", "0")
        self.token = self.manage(
            "shell",
            "-c",
            "from django.contrib.auth import get_user_model\n"
            "from portal.front.services import token_create\n"
            "u = get_user_model().objects.create_user('chaos', 'c@example.org', 'chaos-pw-123')\n"
            "print(token_create(u, name='chaos')[1])\n"
            # Backfill: a job waiting for a GPU does not hold up the CPU jobs (and the probe).
            "from portal.core.models import PolicySettings\n"
            "PolicySettings.objects.all().delete()\n"
            "PolicySettings.objects.create(\n"
            "    name='chaos', policy='fifo', params={'backfill': True}, active=True)\n",
        ).split()[-1]
        self._proc(
            "web",
            [str(BIN / "gunicorn"), "portal.wsgi", "-b", f"127.0.0.1:{self.web_port}", "-w", "2",
             "--threads", "4", "--timeout", "60"],
            self.portal_env,
        ).start()  # fmt: skip
        for i in (1, 2):
            self._proc(
                f"scheduler{i}",
                [str(BIN / "celery"), "-A", "portal.celery", "worker", "-Q", "scheduler", "-P",
                 "solo", "-n", f"chaos{i}-{os.getpid()}@%h", "--without-gossip",
                 "--without-mingle", "-l", "info"],
                self.portal_env,
            ).start()  # fmt: skip
        self._proc(
            "beat",
            [str(BIN / "celery"), "-A", "portal.celery", "beat", "-l", "info", "-s",
             str(self.tmp / "beat-schedule")],
            self.portal_env,
        ).start()  # fmt: skip
        wait_for(self._web_up, 60, "gunicorn")
        for name, gpus in AGENTS.items():
            token_file = self.tmp / f"{name}.token"
            self.manage("node_token", "create", name, "--file", str(token_file))
            argv = [sys.executable, "-m", "workers.agent", "--name", name, "--portal", self.url,
                    "--token-file", str(token_file), "--nudge-url", self.redis_url,
                    "--backend", "virtual", "--cores", "16", "--sample-every", "2",
                    "--run-jobs-as", pwd.getpwuid(os.geteuid()).pw_name]  # fmt: skip
            argv += ["--gpus", gpus] if gpus else ["--kind", "cpu"]
            self._proc(f"agent-{name}", argv, self.agent_env).start()
        wait_for(lambda: self.nodes_up() == len(AGENTS), 90, "the agents to register")

    def stop(self) -> None:
        from workers.agent import kill_marked_processes, marker_for

        for proc in reversed(list(self.procs.values())):
            proc.stop()
        for name in AGENTS:  # their jobs were left to the runners: end them
            kill_marked_processes(marker_for(self.data / "agent" / name))

    def _web_up(self) -> bool:
        try:
            urllib.request.urlopen(self.url + "/login/", timeout=2)
            return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    # -- the portal, as a client ---------------------------------------------------------------

    def api(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int | None, Any]:
        """(HTTP status, decoded body); the status is None when no answer came (a timeout, a
        refused or cut connection), the body then says why."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Token {self.token}")
        request.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=API_TIMEOUT_S) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()[:500].decode(errors="replace")
        except (OSError, ValueError) as exc:  # URLError, TimeoutError, a reset; a cut body
            return None, f"no answer: {type(exc).__name__}: {exc}"

    def query(self, sql: str, params: Any = ()) -> list[tuple]:
        import psycopg

        for attempt in range(5):
            try:
                with psycopg.connect(self.database_url, autocommit=True) as conn:
                    return conn.execute(sql, params).fetchall()
            except psycopg.OperationalError:  # pg-kill may cut us too
                if attempt == 4:
                    raise
                time.sleep(0.2)
        return []

    def nodes_up(self) -> int:
        rows = self.query("SELECT count(*) FROM core_node WHERE status = 'up'")
        return int(rows[0][0]) if rows else 0

    def states(self, ids: list[int]) -> dict[int, str]:
        if not ids:
            return {}
        return dict(self.query("SELECT id, state FROM core_job WHERE id = ANY(%s)", [ids]))

    def submit(self, name: str, gpus: int, seconds: float) -> Submission:
        """Submit a job through the API, trying again (same ``Idempotency-Key``) after a refusal
        or no answer, up to ``SUBMIT_TRIES`` times. Every answer is in the result."""
        command = (
            f"d={self.effects}/$COSCHED_JOB_ID; mkdir -p $d; "
            "date +%s.%N > $d/start.$COSCHED_ATTEMPT.$$; "
            f"sleep {seconds}; "
            "date +%s.%N > $d/end.$COSCHED_ATTEMPT.$$"
        )
        body: dict[str, Any] = {"name": name, "command": command, "gpus": gpus, "cpus": 1}
        if gpus:
            body["gpu_memory_mb"] = 1000
        headers = {"Idempotency-Key": f"chaos-{uuid.uuid4()}"}
        done = Submission(name)
        for attempt in range(SUBMIT_TRIES):
            if attempt:
                time.sleep(SUBMIT_BACKOFF_S * 2 ** (attempt - 1))
            code, data = self.api("POST", "/api/v1/jobs/", body, headers)
            done.answers.append(code)
            # 201 created; 200: a retry whose first try had created the job (its answer lost).
            if code in (200, 201) and isinstance(data, dict) and "id" in data:
                done.job = int(data["id"])
                return done
            done.errors.append(f"HTTP {code}: {data}" if code is not None else str(data))
        return done


@dataclass
class Submission:
    """How one submission went: every answer (None: none came) and the job, if one was made."""

    name: str
    job: int | None = None
    answers: list[int | None] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # why each failed try failed

    @property
    def retried(self) -> int:
        """Failed tries that were tried again (the last try, failed or not, is not one)."""
        return max(0, len(self.answers) - 1)


# --- the watcher --------------------------------------------------------------------------------


class Watcher(threading.Thread):
    """Samples /proc every 0.1 s: which attempts of which jobs have a live process."""

    def __init__(self, markers: set[str]) -> None:
        super().__init__(daemon=True, name="chaos-watcher")
        self.markers = {m.encode() for m in markers}  # our agents' COSCHED_AGENT_ID values
        self.stop_event = threading.Event()
        self.sample_lock = threading.Lock()
        self.known: dict[tuple[int, str], tuple[int, int] | None] = {}
        self.concurrent: dict[int, float] = {}  # job -> first moment two attempts were alive
        self.seen: dict[tuple[int, int], tuple[float, float]] = {}  # (job, attempt) -> first, last
        self.lock = threading.Lock()

    def _identify(self, pid: int) -> tuple[int, int] | None:
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
                ticks = f.read().rsplit(")", 1)[1].split()[19]
        except (OSError, IndexError):
            return None
        key = (pid, ticks)
        if key in self.known:
            return self.known[key]
        found = None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"workers.runner" not in cmdline:  # the runner is not the job
                env = dict(
                    item.split(b"=", 1)
                    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    if b"=" in item
                )
                ours = env.get(b"COSCHED_AGENT_ID") in self.markers
                if ours and b"COSCHED_JOB_ID" in env and b"COSCHED_ATTEMPT" in env:
                    found = (int(env[b"COSCHED_JOB_ID"]), int(env[b"COSCHED_ATTEMPT"]))
        except (OSError, ValueError):
            return None
        self.known[key] = found
        return found

    def sample(self) -> dict[int, set[int]]:
        """job -> attempts with a live process now."""
        alive: dict[int, set[int]] = defaultdict(set)
        with self.sample_lock:
            for name in os.listdir("/proc"):
                if name.isdigit():
                    found = self._identify(int(name))
                    if found is not None:
                        alive[found[0]].add(found[1])
        return alive

    def run(self) -> None:
        while not self.stop_event.is_set():
            now = time.time()
            alive = self.sample()
            with self.lock:
                for job, attempts in alive.items():
                    for attempt in attempts:
                        first, _ = self.seen.get((job, attempt), (now, now))
                        self.seen[(job, attempt)] = (first, now)
                    if len(attempts) > 1:
                        self.concurrent.setdefault(job, now)
            self.stop_event.wait(0.1)


# --- one fault ------------------------------------------------------------------------------------


@dataclass
class Row:
    fault: str
    jobs: int = 0
    lost: int = 0
    twice: int = 0
    concurrent: int = 0
    stuck: int = 0
    unrecorded: int = 0
    restarts: int = 0
    recover_s: float | None = None
    retried: int = 0
    errors: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.twice
            or self.concurrent
            or self.stuck
            or self.unrecorded
            or self.errors
            or self.recover_s is None
        )

    def error(self, note: str) -> None:
        """Something that must not happen and is none of the other columns."""
        self.errors += 1
        self.notes.append(f"ERROR: {note}")

    def count(self, done: Submission) -> int | None:
        """Book one submission: its failed tries as retried (with their answers), and a
        submission out of tries as an error. Returns the job, if one was made."""
        self.retried += done.retried
        if done.job is None:
            self.error(f"submit {done.name} failed {len(done.answers)} times: {done.errors[-1]}")
        elif done.retried:
            self.notes.append(f"submit {done.name} retried after {'; '.join(done.errors)}")
        return done.job


class Fault:
    """One scenario: a batch, the fault, the checks."""

    def __init__(self, stack: Stack, watcher: Watcher, name: str) -> None:
        self.stack = stack
        self.cfg = stack.cfg
        self.watcher = watcher
        self.name = name
        self.row = Row(name)
        self.ids: list[int] = []
        self.cancelled: set[int] = set()
        self.maybe_cancelled: set[int] = set()  # a cancel that got no answer: either end is fine

    def submit(self, name: str, gpus: int, seconds: float) -> int | None:
        """Submit (``Stack.submit``) and book how it went in the row; the job, or None."""
        job = self.row.count(self.stack.submit(name, gpus, seconds))
        if job is not None:
            self.ids.append(job)
        return job

    def submit_batch(self, count: int, tag: str = "") -> list[int]:
        """``count`` jobs, every other one on a GPU; every fourth one outlives the lease, so a
        fault that costs the lease finds jobs both finished and still running."""
        ids = []
        for i in range(count):
            seconds = self.cfg.job_s * (1 if i % 4 else 3)
            job = self.submit(f"{self.name}{tag}-{i}", gpus=i % 2, seconds=seconds)
            if job is not None:
                ids.append(job)
        return ids

    def running(self) -> list[int]:
        return [j for j, s in self.stack.states(self.ids).items() if s == "RUNNING"]

    def busiest_agent(self) -> str:
        rows = self.stack.query(
            "SELECT n.name, count(*) FROM core_placementpart p JOIN core_node n ON n.id = "
            "p.node_id JOIN core_placement a ON a.id = p.placement_id WHERE a.active AND "
            "a.job_id = ANY(%s) GROUP BY 1 ORDER BY 2 DESC, 1",
            [self.ids],
        )
        return rows[0][0] if rows else "chaos-cpu"

    def probe(self) -> float:
        """Seconds from a submission now to its RUNNING (the live path works again)."""
        job = self.submit(f"{self.name}-probe", gpus=0, seconds=0.5)
        if job is None:
            raise RuntimeError(f"{self.name}: the probe job could not be submitted")
        started = time.monotonic()
        wait_for(
            lambda: self.stack.states([job]).get(job) in ("RUNNING", "COMPLETED"),
            self.cfg.lease_s * 4 + 60,
            f"the probe job of {self.name} to run",
            every=0.05,
        )
        return time.monotonic() - started

    def run(self) -> Row:
        began = time.monotonic()
        self.submit_batch(self.cfg.jobs)
        wait_for(lambda: len(self.running()) >= 2, 60, f"{self.name}: jobs to run")
        getattr(self, "inject_" + self.name.replace("-", "_"))()
        self.row.recover_s = self.probe()
        deadline = time.monotonic() + self.cfg.job_s * 4 + self.cfg.lease_s * 3 + 90
        terminal = ("COMPLETED", "FAILED", "CANCELLED")
        with contextlib.suppress(TimeoutError):  # counted as stuck below
            wait_for(
                lambda: all(s in terminal for s in self.stack.states(self.ids).values()),
                deadline - time.monotonic(),
                "the batch to finish",
                every=0.25,
            )
        # Every outcome reported (agents sync every cfg.sync_s): give them a few rounds.
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: self.unrecorded() == 0, 10 * self.cfg.sync_s + 10, "reports")
        self.check()
        self.row.notes.append(f"batch {time.monotonic() - began:.0f} s")
        return self.row

    def unrecorded(self) -> int:
        rows = self.stack.query(
            "SELECT count(*) FROM core_placementpart p JOIN core_placement a ON a.id = "
            "p.placement_id WHERE a.job_id = ANY(%s) AND p.started_at IS NOT NULL "
            "AND p.reported_at IS NULL AND NOT a.active",
            [self.ids],
        )
        return int(rows[0][0])

    def check(self) -> None:
        row = self.row
        row.jobs = len(self.ids)
        states = self.stack.states(self.ids)
        with self.watcher.lock:
            concurrent = {j for j in self.watcher.concurrent if j in states}
            seen = dict(self.watcher.seen)
        for job in self.ids:
            state = states.get(job)
            effects = self.stack.effects / str(job)
            starts = sorted(effects.glob("start.*")) if effects.exists() else []
            ends = sorted(effects.glob("end.*")) if effects.exists() else []
            expected = {"CANCELLED"} if job in self.cancelled else {"COMPLETED"}
            if job in self.maybe_cancelled:
                expected = {"CANCELLED", "COMPLETED"}
            if state not in ("COMPLETED", "FAILED", "CANCELLED"):
                row.stuck += 1
            elif state not in expected or (state == "COMPLETED" and not ends):
                row.lost += 1
                row.notes.append(f"job {job} {state} with {len(ends)} end records")
            if len(ends) > 1:
                row.twice += 1
            # Overlapping records: each attempt from its start to its end (or last seen alive).
            spans = []
            for start in starts:
                attempt = int(start.name.split(".")[1])
                t0 = float(start.read_text())
                end = [e for e in ends if e.name.split(".")[1] == str(attempt)]
                t1 = float(end[0].read_text()) if end else seen.get((job, attempt), (0, t0))[1]
                spans.append((t0, t1))
            spans.sort()
            if any(b[0] < a[1] - 0.05 for a, b in zip(spans, spans[1:], strict=False)):
                concurrent.add(job)
        row.concurrent = len(concurrent)
        row.unrecorded = self.unrecorded()
        attempts = self.stack.query(
            "SELECT count(*) FROM core_placement a JOIN core_placementpart p ON p.placement_id "
            "= a.id WHERE a.job_id = ANY(%s) AND p.started_at IS NOT NULL",
            [self.ids],
        )[0][0]
        ran = len({j for (j, _a) in seen if j in states})
        row.restarts = max(0, int(attempts) - ran)

    # -- the faults --------------------------------------------------------------------------------

    def inject_scheduler_kill(self) -> None:
        """kill -9 of a scheduler worker while it runs a cycle (its log says received, not yet
        succeeded), then start it again."""
        self.submit_batch(self.cfg.jobs, "-burst")  # keep cycles busy
        victim = None
        deadline = time.monotonic() + 15
        next_poke = time.monotonic()
        while victim is None and time.monotonic() < deadline:
            for name in ("scheduler1", "scheduler2"):
                log = self.stack.procs[name].log.read_text(errors="replace")
                task = "cosched.schedule_cycle["
                lines = [line for line in log.splitlines() if task in line]
                if lines and lines[-1].endswith("received"):  # a cycle in hand
                    victim = name
                    break
            if victim is None and time.monotonic() >= next_poke:
                self.submit_batch(1, f"-poke{int(time.monotonic() * 10) % 100000}")  # a cycle
                next_poke = time.monotonic() + 0.5
            time.sleep(0.005)
        mid_cycle = victim is not None
        victim = victim or "scheduler1"
        self.row.notes.append(f"kill -9 of {victim}" + (" mid-cycle" if mid_cycle else ""))
        self.stack.procs[victim].kill9()
        time.sleep(1)
        self.stack.procs[victim].start()

    def inject_agent_kill(self) -> None:
        name = self.busiest_agent()
        held = self.running()
        self.stack.procs[f"agent-{name}"].kill9()
        self.row.notes.append(f"kill -9 of {name}'s agent with {len(held)} jobs running")
        time.sleep(self.cfg.agent_down_s)
        self.stack.procs[f"agent-{name}"].start()

    def inject_agent_freeze(self) -> None:
        name = self.busiest_agent()
        agent = self.stack.procs[f"agent-{name}"]
        agent.signal(signal.SIGSTOP)
        self.row.notes.append(f"SIGSTOP of {name}'s agent for {self.cfg.freeze_s:.0f} s")
        try:
            wait_for(
                lambda: (
                    self.stack.query("SELECT status FROM core_node WHERE name = %s", [name])[0][0]
                    == "down"
                ),
                self.cfg.freeze_s,
                "the frozen node to be marked down",
            )
        except TimeoutError:
            self.row.error(f"{name} was not marked down in the {self.cfg.freeze_s:.0f} s freeze")
        time.sleep(max(0.0, self.cfg.freeze_s - self.cfg.lease_s - self.cfg.margin_s))
        agent.signal(signal.SIGCONT)

    def inject_redis_down(self) -> None:
        redis = self.stack.procs["redis"]
        redis.kill9()
        began = time.monotonic()
        # Every answer, in order: a submission tried again shows each try.
        done = self.stack.submit(f"{self.name}-during", gpus=0, seconds=self.cfg.job_s)
        codes: list[int | None] = list(done.answers)
        extra = self.row.count(done)
        if extra is not None:
            self.ids.append(extra)
        victim = next(iter(self.running()), None)
        if victim is None:
            self.row.error("no job was running to cancel during the outage")
        else:
            code, data = self.stack.api("POST", f"/api/v1/jobs/{victim}/cancel/")
            codes.append(code)
            if code == 200:
                self.cancelled.add(victim)
                killed_in = self._gone(victim, self.cfg.redis_down_s)
                if killed_in is None:
                    self.row.error(
                        f"cancelled job {victim}'s process outlived the outage "
                        f"({self.cfg.redis_down_s:g} s; the agents' HTTP syncs should stop it)"
                    )
                else:
                    self.row.notes.append(
                        f"cancel during the outage: HTTP 200, process gone after {killed_in:.1f} s"
                    )
            else:
                if code is None:  # it may have been applied: either end is right
                    self.maybe_cancelled.add(victim)
                self.row.error(f"cancel of job {victim} during the outage: {code}: {data}")
        self.row.notes.append(f"submit/cancel while Redis was down: HTTP {codes}")
        time.sleep(max(0.0, self.cfg.redis_down_s - (time.monotonic() - began)))
        redis.start()  # back, and empty

    def _gone(self, job: int, timeout: float) -> float | None:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if job not in self.watcher.sample():
                return time.monotonic() - started
            time.sleep(0.1)
        return None

    def inject_messages_dropped(self) -> None:
        """Scheduling messages and nudges lost. The outbox's "a cycle is queued" marker is set
        while no cycle is queued (what a cycle message lost inside Redis leaves behind), so the
        cycle requests of the CPU jobs submitted now are all dropped; and every nudge is lost
        (the agents' pub/sub connections are cut every 0.1 s) until the jobs run. They must be
        placed by beat's periodic cycle and started by the agents' periodic syncs."""
        import redis

        client = redis.Redis.from_url(self.stack.redis_url)
        client.set(CYCLE_MARKER, "chaos: a lost cycle message", ex=30)
        began = time.monotonic()
        late = []
        for i in range(self.cfg.jobs):
            job = self.submit(f"{self.name}-late-{i}", gpus=0, seconds=self.cfg.job_s)
            if job is not None:
                late.append(job)
        cuts = 0

        def all_running() -> float | bool:
            nonlocal cuts
            client.client_kill_filter(_type="pubsub")
            cuts += 1
            states = self.stack.states(late).values()
            return all(st in ("RUNNING", "COMPLETED") for st in states) and time.monotonic()

        ran = wait_for(all_running, self.cfg.cycle_s * 3 + 30, "the late jobs to run", every=0.1)
        self.row.notes.append(
            f"cycle requests swallowed, nudges cut {cuts} times; the {len(late)} jobs submitted "
            f"then all ran after {ran - began:.1f} s (beat's cycle every {self.cfg.cycle_s:g} s, "
            f"syncs every {self.cfg.sync_s:g} s)"
        )

    def inject_pg_kill(self) -> None:
        name = self.stack.database_url.rsplit("/", 1)[1]
        killed = 0
        for _ in range(5):
            rows = self.stack.query(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                [name],
            )
            killed += int(rows[0][0])
            time.sleep(1)
        self.row.notes.append(f"{killed} PostgreSQL connections terminated over 5 s")


# --- the run --------------------------------------------------------------------------------------


@contextlib.contextmanager
def scratch_db() -> Iterator[str]:
    from benchmarks._servers import scratch_database

    base = os.environ.get("TEST_DATABASE_URL") or os.environ.get("DATABASE_URL") or ""
    stem = base.rsplit("/", 1)[-1] if base.startswith("postgres") else "cosched"
    with scratch_database(f"{stem}_chaos"[:60].lower()) as url:
        yield url


def run(quick: bool = False, faults: tuple[str, ...] | None = None) -> list[Row]:
    """Start the stack, run each fault, stop everything; returns one row per fault."""
    cfg = QUICK if quick else FULL
    names = faults or cfg.faults
    unknown = set(names) - set(ALL_FAULTS)
    if unknown:
        raise ValueError(f"unknown faults {sorted(unknown)}; known: {', '.join(ALL_FAULTS)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="cosched-chaos-") as tmp, scratch_db() as db:
        from workers.agent import marker_for

        stack = Stack(Path(tmp), db, cfg)
        watcher = Watcher({marker_for(stack.data / "agent" / name) for name in AGENTS})
        try:
            stack.start()
            watcher.start()
            for name in names:
                print(f"chaos: {name} ...", flush=True)
                row = Fault(stack, watcher, name).run()
                rows.append(row)
                print(format_row(row), flush=True)
            leftovers = sum(len(a) for a in watcher.sample().values())
            if leftovers and rows:
                wait_for(lambda: not watcher.sample(), 30, "job processes to end", every=0.5)
        except Exception:
            for proc in stack.procs.values():
                print(f"--- {proc.name} ({proc.log})\n{proc.tail()}", file=sys.stderr)
            raise
        finally:
            watcher.stop_event.set()
            stack.stop()
    return rows


HEADER = (
    f"{'fault':<18} {'jobs':>4} {'lost':>4} {'twice':>5} {'concurrent':>10} {'stuck':>5} "
    f"{'unrecorded':>10} {'restarts':>8} {'recover s':>9} {'retried':>7} {'errors':>6}  "
    f"{'ok':<4}  notes"
)


def format_row(row: Row) -> str:
    recover = f"{row.recover_s:.1f}" if row.recover_s is not None else "-"
    return (
        f"{row.fault:<18} {row.jobs:>4} {row.lost:>4} {row.twice:>5} {row.concurrent:>10} "
        f"{row.stuck:>5} {row.unrecorded:>10} {row.restarts:>8} {recover:>9} "
        f"{row.retried:>7} {row.errors:>6}  {'ok' if row.ok else 'FAIL':<4}  "
        + "; ".join(row.notes)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.chaos", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short leases, fewer faults")
    parser.add_argument("--fault", action="append", choices=ALL_FAULTS, help="run only these")
    opts = parser.parse_args(argv)
    cfg = QUICK if opts.quick else FULL
    started = time.monotonic()
    rows = run(opts.quick, tuple(opts.fault) if opts.fault else None)
    print()
    print(
        f"chaos ({'quick' if opts.quick else 'full'}), {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"{os.cpu_count()} CPUs; lease {cfg.lease_s:g} s + margin {cfg.margin_s:g} s, "
        f"sync {cfg.sync_s:g} s, {cfg.jobs} jobs of {cfg.job_s:g} s per fault"
    )
    print(HEADER)
    for row in rows:
        print(format_row(row))
    failed = [r.fault for r in rows if not r.ok]
    retried = sum(r.retried for r in rows)
    print(
        f"total {time.monotonic() - started:.0f} s; "
        + (f"FAILED: {', '.join(failed)}" if failed else "every fault ok")
        + f"; {sum(r.errors for r in rows)} errors, {retried} submissions retried"
    )
    return 0 if rows and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
