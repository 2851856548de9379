"""Celery tasks: thin wrappers around the portal's services (``portal.core.*``).

Queue ``scheduler`` (any number of scheduler workers). Node agents have no queue: they sync over
HTTP (``workers.agent``); the portal nudges them through ``portal.core.outbox``. Tasks are sent
by name, so the portal never imports this module.
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
    from portal.core.outbox import clear_cycle_marker
    from portal.core.scheduling import run_cycle

    clear_cycle_marker()
    result = run_cycle()
    return {"placed": result.placed, "pending": result.pending, "seconds": result.seconds}


@shared_task(name="cosched.reconcile", ignore_result=True)
def reconcile() -> list[str]:
    """Nodes whose lease ran out (plus the margin) are lost: their jobs are requeued."""
    from portal.core.nodes import nodes_mark_lost

    return nodes_mark_lost()


@shared_task(name="cosched.outbox_relay", ignore_result=True)
def outbox_relay() -> int:
    from portal.core.outbox import outbox_relay as relay

    return relay()


@shared_task(name="cosched.cluster_metrics", ignore_result=True)
def cluster_metrics() -> int:
    from portal.core.metrics import metrics_cluster_snapshot

    return len(metrics_cluster_snapshot())


@shared_task(name="cosched.metrics_retention", ignore_result=True)
def metrics_retention() -> int:
    from portal.core.joblogs import job_logs_prune
    from portal.core.metrics import metrics_prune

    pruned = metrics_prune(timedelta(days=float(settings.COSCHED["METRICS_RETENTION_DAYS"])))
    return pruned + job_logs_prune()  # full job logs past COSCHED_LOG_RETENTION_DAYS
