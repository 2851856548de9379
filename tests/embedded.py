"""The embedded loop of ``manage.py run_embedded`` inside a test process.

Scheduling cycles, one in-process agent per ``virtual`` node row (jobs are real subprocesses)
and cluster metrics, no broker: what ``make demo`` runs. Use from a test with database access
that commits (``transactional_db`` or ``live_server``): the loop's thread has its own connection.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def embedded_loop(
    settings: Any, log_dir: Path, interval: float = 0.5, arrivals: Any = None
) -> Iterator[list[Any]]:
    """Start the loop and the agents (yielded); on exit stop the loop, kill the job processes
    and clear the in-process metrics store, before pytest-django flushes the database.
    ``settings`` is pytest-django's fixture: the loop runs broker-less whatever the shell says."""
    from portal.core import metrics
    from portal.core.management.commands.run_embedded import EmbeddedLoop, start_virtual_agents

    settings.REDIS_URL = ""
    settings.CELERY_TASK_ALWAYS_EAGER = True
    metrics.metrics_store_clear()
    agents = start_virtual_agents(log_dir=log_dir)
    loop = EmbeddedLoop(agents, interval=interval, arrivals=arrivals)
    loop.start()
    loop.wake("test start")
    try:
        yield agents
    finally:
        loop.stop()
        assert not loop._thread.is_alive(), "the embedded loop thread did not stop"
        for agent in agents:
            agent.shutdown(kill_jobs=True)
        metrics.metrics_store_clear()
