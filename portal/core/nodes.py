"""Writes about nodes: registration by their agent, heartbeats, and declaring silent nodes lost.

A node agent (``workers.agent``) calls ``node_register`` when it starts and ``node_heartbeat``
every few seconds; the scheduler's periodic ``cosched.check_nodes`` task calls
``nodes_mark_lost``. Every change is a conditional update, so two scheduler workers checking the
same node at once requeue its jobs only once.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from portal.core.models import Gpu, Job, Node
from portal.core.services import job_transition
from portal.core.states import PLACED, IllegalTransition

log = logging.getLogger(__name__)

# Gpu row fields an agent may report; anything else in its dicts is ignored.
_GPU_FIELDS = (
    "uuid",
    "model",
    "architecture",
    "memory_mb",
    "sm_count",
    "sharing_modes",
    "mig_profiles",
)


def _node_changed(name: str) -> None:
    """Ask for a scheduling cycle once the current transaction commits."""

    def kick() -> None:
        try:
            from workers import triggers
        except ImportError:
            return
        triggers.on_node_changed(name)

    transaction.on_commit(kick)


def node_register(
    name: str,
    *,
    kind: str,
    cores: int,
    memory_mb: int,
    backend: str,
    gpus: list[dict[str, Any]],
) -> Node:
    """Create or update node ``name`` and its GPUs as its agent sees them; status UP.

    ``gpus`` holds one dict per device with ``index`` and the ``Gpu`` fields (``uuid``,
    ``model``, ``architecture``, ``memory_mb`` (MB), ``sm_count``, ``sharing_modes``,
    ``mig_profiles``). Rows are matched by index, so a GPU keeps its primary key (and its
    placements and metric history) across agent restarts; ``current_mode`` is left alone. A GPU
    row the agent no longer reports is deleted unless an active placement still holds it (that
    one is kept, logged, and its job ends or is requeued the usual way).
    """
    now = timezone.now()
    with transaction.atomic():
        node, created = Node.objects.select_for_update().get_or_create(
            name=name,
            defaults={
                "kind": kind,
                "cores": cores,
                "memory_mb": memory_mb,
                "backend": backend,
                "status": Node.Status.UP,
                "last_heartbeat": now,
            },
        )
        if not created:
            # A draining node stays draining: an agent restart is not an operator's decision.
            status = node.status if node.status == Node.Status.DRAINING else Node.Status.UP
            Node.objects.filter(pk=node.pk).update(
                kind=kind,
                cores=cores,
                memory_mb=memory_mb,
                backend=backend,
                status=status,
                last_heartbeat=now,
            )
        reported = set()
        for device in gpus:
            index = int(device["index"])
            reported.add(index)
            fields = {k: device[k] for k in _GPU_FIELDS if k in device}
            Gpu.objects.update_or_create(node=node, index=index, defaults=fields)
        stale = Gpu.objects.filter(node=node).exclude(index__in=reported)
        held = stale.filter(placements__active=True).distinct()
        for gpu in held:
            log.warning(
                "node %s no longer reports GPU %s, which a running job holds", name, gpu.index
            )
        stale.exclude(pk__in=held.values("pk")).delete()
        _node_changed(name)
    node.refresh_from_db()
    return node


def node_heartbeat(name: str) -> None:
    """Record that node ``name``'s agent is alive now; a DOWN node comes back UP (and a
    scheduling cycle is asked for). Raises ``Node.DoesNotExist`` for an unknown node, so its
    agent can register again."""
    now = timezone.now()
    with transaction.atomic():
        if not Node.objects.filter(name=name).update(last_heartbeat=now):
            raise Node.DoesNotExist(f"node {name!r} is not registered")
        came_back = Node.objects.filter(name=name, status=Node.Status.DOWN).update(
            status=Node.Status.UP
        )
        if came_back:
            log.info("node %s is back up", name)
            _node_changed(name)


def _silence_s(node: Node, now: datetime) -> float:
    """Seconds since the node's last heartbeat (since its creation if it never sent one)."""
    since = node.last_heartbeat or node.created_at
    return max(0.0, (now - since).total_seconds())


def nodes_mark_lost(timeout_s: float) -> list[str]:
    """Mark DOWN every UP node silent for more than ``timeout_s`` seconds; requeue its jobs.

    A node that never sent a heartbeat counts from its creation. Each node is taken with a
    conditional update (status still UP and still silent), so of two concurrent callers only one
    requeues. Its SCHEDULED / RUNNING / PAUSED jobs go back to PENDING with the timeline message
    "node X lost (no heartbeat for N s)". Returns the names of the nodes marked down.
    """
    now = timezone.now()
    cutoff = now - timedelta(seconds=timeout_s)
    silent = Q(last_heartbeat__lt=cutoff) | Q(last_heartbeat__isnull=True, created_at__lt=cutoff)
    lost: list[str] = []
    for node in Node.objects.filter(silent, status=Node.Status.UP).order_by("name"):
        with transaction.atomic():
            won = Node.objects.filter(silent, pk=node.pk, status=Node.Status.UP).update(
                status=Node.Status.DOWN
            )
            if not won:
                continue  # it sent a heartbeat meanwhile, or another worker took it
            message = f"node {node.name} lost (no heartbeat for {_silence_s(node, now):.0f} s)"
            log.warning(message)
            jobs = Job.objects.filter(
                placements__node=node, placements__active=True, state__in=list(PLACED)
            ).distinct()
            for job in jobs:
                # IllegalTransition: it ended or was cancelled while we looked
                with contextlib.suppress(IllegalTransition):
                    job_transition(
                        job, "PENDING", actor="scheduler", message=message, expected=job.state
                    )
        lost.append(node.name)
    return lost
