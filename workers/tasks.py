"""Celery tasks: thin wrappers around the services (portal.core.*) and the node agent.

Queues: ``scheduler`` (cycles and maintenance; any number of scheduler workers) and
``node.<name>`` (served by that node's agent, ``manage.py node_agent``).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings

log = logging.getLogger(__name__)


@shared_task(name="cosched.schedule_cycle", ignore_result=True)
def schedule_cycle(reason: str = "") -> dict[str, Any]:
    from portal.core.scheduling import run_cycle
    from workers.dispatch import clear_cycle_marker

    clear_cycle_marker()
    result = run_cycle()
    return {"placed": result.placed, "pending": result.pending, "seconds": result.seconds}


def _agent(node: str):  # type: ignore[no-untyped-def]
    from workers.agent import local_agent

    agent = local_agent(node)
    if agent is None:
        log.warning("no agent for node %s in this process; task dropped", node)
    return agent


@shared_task(name="cosched.node_launch", ignore_result=True, acks_late=True)
def node_launch(node: str, job_id: int) -> None:
    agent = _agent(node)
    if agent is not None:
        agent.launch(job_id)


@shared_task(name="cosched.node_control", ignore_result=True, acks_late=True)
def node_control(node: str, job_id: int, action: str) -> None:
    agent = _agent(node)
    if agent is not None:
        agent.control(job_id, action)


@shared_task(name="cosched.check_nodes", ignore_result=True)
def check_nodes() -> list[str]:
    from portal.core.nodes import nodes_mark_lost

    lost = nodes_mark_lost(float(settings.COSCHED["NODE_DOWN_AFTER_S"]))
    if lost:
        from workers.triggers import on_node_changed

        for name in lost:
            on_node_changed(name)
    return lost


@shared_task(name="cosched.cluster_metrics", ignore_result=True)
def cluster_metrics() -> int:
    from portal.core.metrics import metrics_cluster_snapshot

    return len(metrics_cluster_snapshot())


@shared_task(name="cosched.metrics_retention", ignore_result=True)
def metrics_retention() -> int:
    from portal.core.metrics import metrics_prune

    return metrics_prune(timedelta(days=float(settings.COSCHED["METRICS_RETENTION_DAYS"])))
