"""Node operations, as ``scontrol update nodename=... state=...`` does them in Slurm.

- **drain**: the node finishes the jobs it runs and receives no new ones (status DRAINING; the
  scheduling cycle places work only on UP nodes). Once nothing runs there it shows as
  *drained*.
- **down**: the node is taken out of service now: its jobs are preempted back to the queue
  (their agents stop them at the next sync, with the usual SIGTERM grace), and the node stays
  down (``held_down``) even while its agent keeps syncing, until a resume.
- **resume**: back to UP from either; the reason is cleared.

Drain and down need a reason (who looks at the cluster page later wants to know why); every
change records who made it and when, and asks for a scheduling cycle.
"""

from __future__ import annotations

import contextlib
import logging

from django.db import transaction
from django.utils import timezone

from portal.core.models import Job, Node, Placement
from portal.core.nodes import locked_nodes
from portal.core.outbox import emit_nudges, emit_schedule
from portal.core.services import job_preempt
from portal.core.states import PLACED, IllegalTransition

log = logging.getLogger(__name__)

REASON_MAX = 500
ACTIONS = ("drain", "down", "resume")


class NodeOpError(ValueError):
    """A node operation that cannot be done; ``field`` names the input at fault."""

    def __init__(self, message: str, field: str = "non_field_errors") -> None:
        super().__init__(message)
        self.field = field


def _reason(reason: str | None) -> str:
    text = (reason or "").strip()
    if not text:
        raise NodeOpError(
            "say why (e.g. 'replacing a fan'): drain and down need a reason", "reason"
        )
    if len(text) > REASON_MAX:
        raise NodeOpError(f"at most {REASON_MAX} characters", "reason")
    if "\x00" in text:
        raise NodeOpError("the reason may not contain NUL characters", "reason")
    return text


def running_jobs_on(node: Node) -> list[int]:
    """Ids of the jobs with an active attempt on ``node`` (any part of a gang)."""
    return list(
        Placement.objects.filter(active=True, parts__node=node, job__state__in=list(PLACED))
        .values_list("job_id", flat=True)
        .distinct()
        .order_by("job_id")
    )


def node_drain(node: Node, *, actor: str, reason: str | None) -> Node:
    """DRAINING with ``reason``: running jobs finish, no new job is placed there."""
    text = _reason(reason)
    with transaction.atomic():
        locked = locked_nodes().get(pk=node.pk)
        if locked.held_down:
            raise NodeOpError(
                f"node {locked.name} is down ({locked.state_reason}): resume it first", "node"
            )
        Node.objects.filter(pk=locked.pk).update(
            status=Node.Status.DRAINING,
            state_reason=text,
            state_changed_by=actor,
            state_changed_at=timezone.now(),
        )
        # A lost node drained now is marked down again by the lost-node check; it keeps its
        # reason, and comes back DRAINING when its agent syncs (agent_sync._renew).
        emit_schedule(f"node {locked.name} drained by {actor}")
    log.info("node %s drained by %s: %s", node.name, actor, text)
    node.refresh_from_db()
    return node


def node_down(node: Node, *, actor: str, reason: str | None) -> tuple[Node, list[int]]:
    """DOWN and held down with ``reason``; its running jobs go back to the queue. Returns the
    node and the ids of the jobs preempted."""
    text = _reason(reason)
    preempted: list[int] = []
    with transaction.atomic():
        locked = locked_nodes().get(pk=node.pk)
        Node.objects.filter(pk=locked.pk).update(
            status=Node.Status.DOWN,
            held_down=True,
            state_reason=text,
            state_changed_by=actor,
            state_changed_at=timezone.now(),
        )
        for job_id in running_jobs_on(locked):
            # IllegalTransition: it ended while we looked
            with contextlib.suppress(IllegalTransition):
                job_preempt(
                    Job(pk=job_id), actor=actor, reason=f"node {locked.name} taken down: {text}"
                )
                preempted.append(job_id)
        emit_nudges({locked.name}, f"node {locked.name} down")
        emit_schedule(f"node {locked.name} down by {actor}")
    log.info("node %s down by %s (%d jobs requeued): %s", node.name, actor, len(preempted), text)
    node.refresh_from_db()
    return node, preempted


def node_resume(node: Node, *, actor: str) -> Node:
    """Back to UP (from DRAINING or a staff DOWN); the reason is cleared. A node whose agent
    stopped syncing is marked down again by the lost-node check, as before."""
    with transaction.atomic():
        locked = locked_nodes().get(pk=node.pk)
        if locked.status == Node.Status.UP and not locked.held_down:
            raise NodeOpError(f"node {locked.name} is up already", "node")
        Node.objects.filter(pk=locked.pk).update(
            status=Node.Status.UP,
            held_down=False,
            state_reason="",
            state_changed_by=actor,
            state_changed_at=timezone.now(),
        )
        emit_schedule(f"node {locked.name} resumed by {actor}")
    log.info("node %s resumed by %s", node.name, actor)
    node.refresh_from_db()
    return node


def node_state_label(node: Node, running: int | None = None) -> str:
    """What sinfo would say: ``up``, ``draining`` (jobs still running), ``drained`` (nothing
    left), ``down`` (lost) or ``down (staff)``."""
    if node.status == Node.Status.DRAINING:
        if running is None:
            running = len(running_jobs_on(node))
        return "draining" if running else "drained"
    if node.status == Node.Status.DOWN:
        return "down (staff)" if node.held_down else "down"
    return str(node.status)
