"""``manage.py node_agent``: run one node's agent (a Celery worker on ``node.<name>`` + a sampler).

    python manage.py node_agent --name gpu-1 --backend nvml
    python manage.py node_agent --name v1 --backend virtual --gpus "A30x2"
    python manage.py node_agent --name c1 --backend virtual --kind cpu --cores 32

The agent registers the node and its GPUs, then runs two things in this process: a sampler thread
calling ``NodeAgent.tick`` every ``--interval`` seconds (reap ended jobs, metrics, log tails,
heartbeat), and a Celery worker (thread pool) serving the node's own queue, whose tasks call
``launch`` / ``control`` (``workers.tasks``).

It needs a broker (``REDIS_URL``): the embedded default has none and runs its virtual agents
in-process instead (``make demo``).

**Shutdown** (SIGTERM, SIGINT): Celery's warm shutdown finishes the task in hand, then the sampler
stops. Running jobs are deliberately left running: restarting or upgrading the agent must not kill
hours of training. If the agent comes back before the node-lost timeout
(``COSCHED_NODE_DOWN_AFTER_S``), ``register`` requeues the jobs it no longer follows and kills
their leftover processes; if it does not, the scheduler marks the node down and requeues them.

Exit codes: the Celery worker's after a shutdown (0 after SIGTERM, 1 after SIGINT, as
``celery worker``); 2 on a usage, backend (e.g. NVML missing) or broker problem.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from celery.utils.nodenames import host_format
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections

from scheduler.interference import INTERFERENCE_MODELS, InterferenceError, build_interference
from workers.gpu import GpuBackend, GpuBackendError, open_backend

log = logging.getLogger("workers.agent")


def _total_memory_mb() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20)
    except (ValueError, OSError, AttributeError):
        return 0


class Command(BaseCommand):
    help = "Run a node agent: register the node, sample it, and serve its Celery queue."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", required=True, help="node name (its queue: node.<name>)")
        parser.add_argument("--backend", choices=["virtual", "nvml"], default="virtual")
        parser.add_argument(
            "--gpus",
            help='virtual GPU models, e.g. "A30x2" or "V100x2,T4" (virtual backend only; '
            "default A30x2 on a GPU node)",
        )
        parser.add_argument(
            "--interference",
            choices=sorted(INTERFERENCE_MODELS),
            default="class_based",
            help="model slowing co-located jobs on virtual GPUs (virtual backend only)",
        )
        parser.add_argument("--kind", choices=["gpu", "cpu"], default="gpu")
        parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
        parser.add_argument("--memory-mb", type=int, default=_total_memory_mb())
        parser.add_argument("--interval", type=float, default=2.0, help="sampler period, s")
        parser.add_argument("--concurrency", type=int, default=4, help="worker threads")

    def handle(self, *args: Any, **opts: Any) -> None:
        name: str = opts["name"]
        if opts["interval"] <= 0 or opts["concurrency"] < 1:
            raise CommandError("--interval and --concurrency must be positive", returncode=2)
        backend = self._backend(name, opts)
        if not settings.REDIS_URL:
            if backend is not None:
                backend.close()
            raise CommandError(
                "node_agent needs a broker: set REDIS_URL (the embedded default has none and "
                "runs its virtual node agents in-process; see `make demo`)",
                returncode=2,
            )
        from portal.celery import app
        from workers.agent import NodeAgent, register_local

        agent = NodeAgent(
            name,
            backend,
            kind=opts["kind"],
            cores=opts["cores"],
            memory_mb=opts["memory_mb"],
            backend_name=opts["backend"],
        )
        node = agent.register()
        register_local(agent)
        models = list(node.gpus.order_by("index").values_list("model", flat=True))
        gpus = f"GPUs {', '.join(models)} ({opts['backend']} backend)" if models else "no GPU"
        self.stdout.write(
            f"node {name}: {opts['kind']}, {gpus}, {opts['cores']} cores; queue node.{name}"
        )

        stop = threading.Event()
        sampler = threading.Thread(
            target=self._sample, args=(agent, opts["interval"], stop), name="sampler", daemon=True
        )
        sampler.start()
        worker = app.Worker(
            queues=[f"node.{name}"],
            pool="threads",
            concurrency=opts["concurrency"],
            hostname=host_format(f"agent-{name}@%h"),
            loglevel="INFO",
            redirect_stdouts=False,
        )
        try:
            worker.start()  # blocks; Celery turns SIGTERM / SIGINT into a warm shutdown
        finally:
            stop.set()
            sampler.join(timeout=opts["interval"] + 30)
            agent.shutdown(kill_jobs=False)  # see the module docstring
        sys.exit(worker.exitcode or 0)

    def _backend(self, name: str, opts: dict[str, Any]) -> GpuBackend | None:
        """The GPU backend the options ask for (None on a CPU node); CommandError, exit 2,
        with the backend's own one-line reason when it cannot open."""
        if opts["gpus"] and opts["backend"] != "virtual":
            raise CommandError(
                "--gpus describes virtual GPUs; use it with --backend virtual", returncode=2
            )
        if opts["kind"] == "cpu":
            if opts["gpus"]:
                raise CommandError("a CPU node (--kind cpu) has no --gpus", returncode=2)
            return None
        try:
            if opts["backend"] == "virtual":
                backend = open_backend(
                    "virtual",
                    models=opts["gpus"] or "A30x2",
                    node=name,
                    interference=build_interference(opts["interference"]),
                )
            else:
                backend = open_backend("nvml")
            if not backend.devices():
                backend.close()
                raise GpuBackendError(f"the {opts['backend']} backend sees no GPU on this node")
        except (GpuBackendError, InterferenceError) as exc:
            message = " ".join(str(exc).split())  # one line, whatever the backend wrote
            raise CommandError(f"node {name}: {message}", returncode=2) from None
        return backend

    @staticmethod
    def _sample(agent: Any, interval: float, stop: threading.Event) -> None:
        """The sampler thread: tick every ``interval`` seconds until ``stop``; an error is
        logged and the next round tries again (a database blip must not stop heartbeats)."""
        while not stop.is_set():
            try:
                close_old_connections()
                agent.tick()
            except Exception:
                log.exception("node %s: tick failed", agent.name)
            stop.wait(interval)
