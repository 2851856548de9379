"""Writes about nodes: registration, node tokens, leases and declaring nodes lost
(docs/reliability.md).

A node's agent registers (``node_register``, from its first sync's ``NodeInfo``) and renews the
node's **lease** with every sync (``portal.core.agent_sync``). The periodic reconciliation
(``cosched.reconcile``) calls ``nodes_mark_lost``: a node whose lease ran out more than
``COSCHED_LEASE_MARGIN_S`` ago is DOWN, its unsettled attempt parts are fenced (its runners
stopped them when the lease ran out), and the jobs they belonged to go back to PENDING. Every
change is a conditional update, so two scheduler workers checking the same node at once requeue
its jobs only once.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from portal.core.models import Gpu, Job, Node, NodeToken, Placement, PlacementPart
from portal.core.outbox import emit_nudges, emit_schedule
from portal.core.services import job_transition
from portal.core.states import PLACED, IllegalTransition
from workers.protocol import NODE_TOKEN_PREFIX

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
TOKEN_PREFIX_SHOWN = 8
TOKEN_LAST_USED_RESOLUTION = timedelta(minutes=1)


def locked_nodes() -> Any:
    """Nodes, to lock for a change of their state: ``FOR NO KEY UPDATE``. It serialises a
    node's syncs, registrations, drains and downs as ``FOR UPDATE`` would, but lets another
    transaction that inserts a row referencing the node (a placement part, a command, an
    event) check that foreign key meanwhile. Under ``FOR UPDATE`` that check waits for the
    lock, and a sync holding its node while it waits for a job row such a transaction holds
    is a deadlock (it was: a preempt from the job page against the agent's sync)."""
    return Node.objects.select_for_update(no_key=True)


def lease_s() -> float:
    """How long one sync keeps a node's lease (s): ``COSCHED_LEASE_S``."""
    return float(settings.COSCHED["LEASE_S"])


def lease_margin_s() -> float:
    """How long after its lease ran out a node's jobs are started elsewhere (s):
    ``COSCHED_LEASE_MARGIN_S``; more than the runners need to stop a job (their grace)."""
    return float(settings.COSCHED["LEASE_MARGIN_S"])


def lease_kill_grace_s() -> float:
    """SIGTERM -> SIGKILL delay of a runner stopping a job whose lease ran out: half the margin
    (at most 5 s), so the job is gone well before the margin ends."""
    return min(5.0, lease_margin_s() / 2)


def node_register(
    name: str,
    *,
    kind: str,
    cores: int,
    memory_mb: int,
    backend: str,
    gpus: list[dict[str, Any]],
    address: str = "",
    isolation: list[dict[str, str]] | None = None,
    container_runtimes: list[str] | None = None,
) -> Node:
    """Create or update node ``name`` and its GPUs as its agent sees them; status UP.

    ``gpus`` holds one dict per device with ``index`` and the ``Gpu`` fields (``uuid``,
    ``model``, ``architecture``, ``memory_mb`` (MB), ``sm_count``, ``sharing_modes``,
    ``mig_profiles``); ``isolation`` how the node keeps jobs apart (``NodeInfo.isolation``).
    Rows are matched by index, so a GPU keeps its primary key (and its
    placements and metric history) across agent restarts; ``current_mode`` is left alone. A GPU
    row the agent no longer reports is deleted unless an active placement still holds it (that
    one is kept, logged, and its job ends or is requeued the usual way). A DRAINING node stays
    DRAINING. Asks for a scheduling cycle (outbox) in the same transaction.
    """
    now = timezone.now()
    with transaction.atomic():
        node, created = locked_nodes().get_or_create(
            name=name,
            defaults={
                "kind": kind,
                "cores": cores,
                "memory_mb": memory_mb,
                "backend": backend,
                "status": Node.Status.UP,
                "last_heartbeat": now,
                "address": address,
                "isolation": isolation or [],
                "container_runtimes": container_runtimes or [],
            },
        )
        if not created:
            # A draining node stays draining: an agent restart is not an operator's decision.
            status = node.status if node.status == Node.Status.DRAINING else Node.Status.UP
            if node.held_down:
                status = Node.Status.DOWN  # taken down by staff: only a resume lifts it
            Node.objects.filter(pk=node.pk).update(
                kind=kind,
                cores=cores,
                memory_mb=memory_mb,
                backend=backend,
                status=status,
                last_heartbeat=now,
                address=address,
                isolation=isolation or [],
                container_runtimes=container_runtimes or [],
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
        emit_schedule(f"node {name} changed")
    node.refresh_from_db()
    return node


# --- node tokens ----------------------------------------------------------------------------------


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def node_token_create(node_name: str) -> tuple[NodeToken, str]:
    """A new token for the agent of node ``node_name``; returns ``(token, key)``. The key is
    shown once (only its SHA-256 is stored); older tokens of the node stay valid until
    revoked (rotate: create, deploy, then ``node_token_revoke(..., keep=new)``)."""
    node_name = node_name.strip()
    if not node_name or len(node_name) > 100:
        raise ValueError("give the node's name (at most 100 characters)")
    key = NODE_TOKEN_PREFIX + secrets.token_urlsafe(30)
    token = NodeToken.objects.create(
        node_name=node_name,
        prefix=key[: len(NODE_TOKEN_PREFIX) + TOKEN_PREFIX_SHOWN],
        key_hash=_hash(key),
    )
    return token, key


def node_token_revoke(node_name: str, *, keep: NodeToken | None = None) -> int:
    """Revoke every active token of ``node_name`` (but ``keep``); returns how many."""
    tokens = NodeToken.objects.filter(node_name=node_name, revoked_at=None)
    if keep is not None:
        tokens = tokens.exclude(pk=keep.pk)
    return tokens.update(revoked_at=timezone.now())


def node_token_revoke_one(token: NodeToken) -> bool:
    """Revoke this one token (the staff page's button); False if it was revoked already."""
    return bool(
        NodeToken.objects.filter(pk=token.pk, revoked_at=None).update(revoked_at=timezone.now())
    )


def node_token_node(key: str) -> str | None:
    """The node whose active token ``key`` is, or None; records when it was used."""
    if not key.startswith(NODE_TOKEN_PREFIX):
        return None
    token = NodeToken.objects.filter(key_hash=_hash(key), revoked_at=None).first()
    if token is None:
        return None
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > TOKEN_LAST_USED_RESOLUTION:
        NodeToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.node_name


# --- lost nodes -----------------------------------------------------------------------------------


def _expired(now: datetime) -> Q:
    """Nodes whose lease ran out more than the margin ago (a node that never synced counts
    from its creation, as if its first lease started then)."""
    margin = timedelta(seconds=lease_margin_s())
    lease = timedelta(seconds=lease_s())
    return Q(lease_expires_at__lt=now - margin) | Q(
        lease_expires_at__isnull=True, created_at__lt=now - lease - margin
    )


def nodes_mark_lost(now: datetime | None = None) -> list[str]:
    """Mark DOWN every UP or DRAINING node whose lease ran out more than
    ``COSCHED_LEASE_MARGIN_S`` ago; fence its attempt parts and requeue their jobs.

    By then the node's runners have stopped its jobs (they stop them when the lease runs out,
    and the margin is longer than their grace), so starting them again elsewhere cannot make
    two attempts of one job run at once. Each node is taken with a conditional update, so of
    two concurrent callers only one requeues. Every attempt with a part on the node ends
    (SCHEDULED / RUNNING / PAUSED -> PENDING, "node X lost ..."), and the other nodes of a gang
    are nudged to stop their ranks. Returns the names of the nodes marked down.
    """
    now = now or timezone.now()
    lost: list[str] = []
    candidates = Node.objects.filter(
        _expired(now), status__in=[Node.Status.UP, Node.Status.DRAINING]
    ).order_by("name")
    for node in candidates:
        with transaction.atomic():
            won = (
                Node.objects.filter(_expired(now), pk=node.pk, status=node.status)
                .exclude(status=Node.Status.DOWN)
                .update(status=Node.Status.DOWN)
            )
            if not won:
                continue  # it synced meanwhile, or another worker took it
            since = node.last_heartbeat or node.created_at
            message = f"node {node.name} lost (no sync for {(now - since).total_seconds():.0f} s"
            if node.lease_expires_at is not None:
                message += f"; its lease ran out at {node.lease_expires_at:%H:%M:%S} UTC"
            message += ")"
            log.warning(message)
            # Its runners stopped these when the lease ran out: nothing of them runs now.
            PlacementPart.objects.filter(
                node=node, settled_at__isnull=True, offered_at__isnull=False
            ).update(settled_at=now)
            attempts = Placement.objects.filter(
                active=True, parts__node=node, job__state__in=list(PLACED)
            ).distinct()
            others: set[str] = set()
            for placement in attempts.prefetch_related("parts__node"):
                others.update(p.node.name for p in placement.parts.all() if p.node_id != node.pk)
                job = Job(pk=placement.job_id)
                # IllegalTransition: it ended or was cancelled while we looked
                with contextlib.suppress(IllegalTransition):
                    job_transition(job, "PENDING", actor="scheduler", message=message)
            emit_nudges(others, f"node {node.name} lost")
            emit_schedule(f"node {node.name} lost")
        lost.append(node.name)
    return lost
