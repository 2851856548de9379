"""``python manage.py run_embedded``: the whole of Cosched in one process (``make demo``).

Web server (Django's, threaded), the scheduling loop, and one in-process node agent per
``virtual`` node in the database (``load_demo`` makes three: Titan Xp, A30 and a CPU node). No
broker: the outbox wakes the loop thread, and the agents are ``workers.agent.NodeAgent`` objects
syncing through ``portal.core.agent_sync.InProcessTransport`` (the protocol's messages, no
HTTP). Their jobs run under runners like anywhere else, and their state is under
``<data>/agent/<node>``: jobs left running by a run killed with SIGKILL are adopted by the next
one (or stopped by their lease). The GPUs are the ``virtual`` backend's: simulated, not real.
"""

from __future__ import annotations

import logging
import math
import signal
import sys
import threading
import time
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

log = logging.getLogger("cosched.embedded")


class EmbeddedLoop:
    """The loop thread: a scheduling cycle and the agents' ticks whenever woken (or every
    ``interval`` seconds), and the beat schedule's maintenance tasks (lost nodes, cluster
    metrics, retention) at their own periods, run in this thread since there is no beat."""

    def __init__(self, agents: list[Any], interval: float = 2.0, arrivals: Any = None) -> None:
        self.agents = agents
        self.interval = interval
        self.arrivals = arrivals  # a portal.core.demo.ArrivalStream, or None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cosched-loop", daemon=True)
        self._last_run: dict[str, float] = {}  # beat entry -> when it last ran (monotonic)

    def wake(self, reason: str = "") -> None:
        self._wake.set()

    def start(self) -> None:
        from portal.core import outbox

        outbox.set_local_waker(self.wake)
        self._thread.start()

    def stop(self) -> None:
        from portal.core import outbox

        outbox.set_local_waker(None)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)

    def step(self) -> None:
        """One pass; public so a test can drive the loop without its thread."""
        from django.db import close_old_connections

        import workers.tasks  # noqa: F401  (registers the beat schedule's tasks)
        from portal.celery import app
        from portal.core.outbox import outbox_relay
        from portal.core.scheduling import run_cycle

        close_old_connections()
        if self.arrivals is not None:
            try:
                self.arrivals.step()
            except Exception:  # an arrival that cannot be submitted must not stop the loop
                log.exception("demo arrival failed")
        run_cycle()
        outbox_relay()
        for agent in self.agents:
            agent.step()
        now = time.monotonic()
        for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
            if entry["task"] == "cosched.schedule_cycle":
                continue  # every step runs a cycle
            if now - self._last_run.get(name, -math.inf) >= float(entry["schedule"]):
                self._last_run[name] = now
                app.tasks[entry["task"]]()  # the task's body, in this thread

    def _run(self) -> None:
        from django.db import connections

        try:
            while not self._stop.is_set():
                self._wake.wait(self.interval)
                self._wake.clear()
                if self._stop.is_set():
                    break
                try:
                    self.step()
                except Exception:  # keep the demo alive; the log says what broke
                    log.exception("embedded loop step failed")
        finally:  # this thread's own connection: left open it would block a database drop
            connections.close_all()


def start_virtual_agents(
    *, log_dir: Any = None, portal_url: str | None = None, job_users: Any = None
) -> list[Any]:
    """One in-process ``NodeAgent`` per ``virtual`` node row (in-process transport), its local
    state read (attempts of an earlier run adopted or collected) and registered by a first
    sync. ``log_dir``: where job logs go (its parent holds the agents' state); default
    ``<COSCHED_DATA_DIR>/logs``. ``portal_url``: given to jobs as ``COSCHED_API_URL`` (the
    training SDK)."""
    from pathlib import Path

    from portal.core.agent_sync import InProcessTransport
    from portal.core.models import Node
    from scheduler.interference import build_interference
    from workers.agent import NodeAgent
    from workers.gpu.virtual_backend import VirtualBackend

    agents = []
    interference = build_interference("class_based")
    data_dir = Path(log_dir).parent if log_dir is not None else Path(settings.DATA_DIR)
    for node in Node.objects.filter(backend="virtual").prefetch_related("gpus"):
        models = [g.model for g in sorted(node.gpus.all(), key=lambda g: g.index)]
        backend = None
        if models:
            backend = VirtualBackend(models, node=node.name, interference=interference)
        agent = NodeAgent(
            node.name,
            backend,
            InProcessTransport(portal_url),
            kind=node.kind,
            cores=node.cores,
            memory_mb=node.memory_mb,
            backend_name="virtual",
            data_dir=data_dir,
            log_dir=Path(log_dir) if log_dir is not None else None,
            address="127.0.0.1",
            job_users=job_users,
        )
        agent.start()
        agent.step()
        agents.append(agent)
    return agents


def _job_users(run_as: str | None) -> Any:
    """The agents' job accounts for ``--run-jobs-as`` (None: every job as this process's own
    account, the demo's default); CommandError when this process cannot apply it."""
    from workers.isolation import IsolationError, JobUsers

    if not run_as:
        return None
    try:
        users = JobUsers.from_options(run_as)
        users.check()
    except IsolationError as exc:
        raise CommandError(f"--run-jobs-as {run_as}: {exc}") from None
    return users


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    sys.exit(0)


class Command(BaseCommand):
    help = (
        "Run Cosched in one process: web server, scheduling loop and in-process agents for the "
        "virtual nodes (the embedded default; no broker needed)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")
        parser.add_argument("--interval", type=float, default=2.0, help="loop period (s)")
        parser.add_argument(
            "--no-server", action="store_true", help="run the loop only (until Ctrl-C)"
        )
        parser.add_argument(
            "--arrivals-per-minute",
            type=float,
            default=0.0,
            help="submit demo jobs for the demo user at this mean rate (Poisson arrivals of "
            "the demo's applications; 0: off; `make demo` uses 12)",
        )
        parser.add_argument(
            "--arrivals-scale",
            type=float,
            default=0.2,
            help="the arriving jobs' emulator --scale (profile times x this; default 0.2)",
        )
        parser.add_argument(
            "--arrivals-max-queued",
            type=int,
            default=20,
            help="skip arrivals while the demo user has this many jobs queued (default 20)",
        )
        parser.add_argument("--arrivals-seed", type=int, default=None, help="arrivals' seed")
        parser.add_argument(
            "--run-jobs-as",
            default=None,
            help="'owner': each job as its portal owner's unix account (root only; docs/"
            "security.md), or one account NAME for every job (default: this process's account)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        if not settings.CELERY_TASK_ALWAYS_EAGER:
            raise CommandError(
                "run_embedded is the broker-less default; with REDIS_URL set, run the web "
                "server, `celery -A portal worker -Q scheduler`, `celery -A portal beat` and "
                "`python -m workers.agent` on each node instead"
            )
        # Tasks run in-process here: Celery's "Task ... succeeded" line per launch is noise.
        logging.getLogger("celery.app.trace").setLevel(logging.WARNING)
        addrport = str(opts["addrport"])
        job_users = _job_users(opts["run_jobs_as"])
        agents = start_virtual_agents(
            job_users=job_users,
            portal_url=f"http://{addrport if ':' in addrport else '127.0.0.1:' + addrport}",
        )
        if not agents:
            self.stderr.write("no virtual nodes in the database: run `manage.py load_demo` first")
        # SIGTERM (a service manager, `kill`) ends the run like Ctrl-C: the finally below kills
        # the job processes instead of leaving them orphaned.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        arrivals = None
        if opts["arrivals_per_minute"] < 0 or opts["arrivals_max_queued"] < 1:
            raise CommandError("--arrivals-per-minute must be >= 0, --arrivals-max-queued >= 1")
        if opts["arrivals_per_minute"] > 0:
            from portal.core.demo import ArrivalStream

            arrivals = ArrivalStream(
                opts["arrivals_per_minute"],
                scale=opts["arrivals_scale"],
                max_queued=opts["arrivals_max_queued"],
                seed=opts["arrivals_seed"],
            )
        loop = EmbeddedLoop(agents, interval=opts["interval"], arrivals=arrivals)
        loop.start()
        loop.wake("start")
        names = ", ".join(a.name for a in agents) or "none"
        self.stdout.write(f"embedded loop running; in-process virtual nodes: {names}")
        if arrivals is not None:
            self.stdout.write(
                f"demo arrivals: {arrivals.per_minute:g} jobs/min for user {arrivals.username} "
                f"(emulator --scale {arrivals.scale:g}, paused while "
                f"{arrivals.max_queued} are queued)"
            )
        try:
            if opts["no_server"]:
                while True:
                    time.sleep(3600)
            else:
                call_command("runserver", opts["addrport"], use_reloader=False)
        except KeyboardInterrupt:
            pass
        finally:
            loop.stop()
            for agent in agents:
                agent.shutdown(kill_jobs=True)
