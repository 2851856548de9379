"""Where tasks go: the scheduler's queue and each node's own queue (``node.<name>``).

Without a broker (the embedded default, ``CELERY_TASK_ALWAYS_EAGER``) a task runs in the calling
thread; the embedded loop then reaches its in-process node agents directly.
"""

from __future__ import annotations

import logging

from django.conf import settings

log = logging.getLogger(__name__)

SCHEDULER_QUEUE = "scheduler"
# While this key exists a cycle is queued and has not started: no need to queue another.
CYCLE_PENDING_KEY = "cosched:cycle-queued"


def node_queue(node: str) -> str:
    return f"node.{node}"


def _redis():  # type: ignore[no-untyped-def]
    import redis

    return redis.Redis.from_url(settings.REDIS_URL)


def schedule_soon(reason: str = "") -> bool:
    """Queue one scheduling cycle unless one is already queued; True if a task was sent.

    Many triggers in a burst (200 submissions) coalesce into a few cycles: the cycle clears the
    marker before it reads its snapshot, so every trigger is covered by a cycle that starts
    after it.
    """
    from workers import tasks

    if settings.CELERY_TASK_ALWAYS_EAGER:
        tasks.schedule_cycle.apply(kwargs={"reason": reason})
        return True
    try:
        if not _redis().set(CYCLE_PENDING_KEY, reason or "1", nx=True, ex=30):
            return False
    except Exception:  # Redis hiccup: better one cycle too many than one too few
        log.exception("could not set the cycle marker")
    tasks.schedule_cycle.apply_async(kwargs={"reason": reason}, queue=SCHEDULER_QUEUE)
    return True


def clear_cycle_marker() -> None:
    if settings.CELERY_TASK_ALWAYS_EAGER:
        return
    try:
        _redis().delete(CYCLE_PENDING_KEY)
    except Exception:
        log.exception("could not clear the cycle marker")


def launch(node: str, job_id: int) -> None:
    """Ask ``node``'s agent to start job ``job_id`` (placed and committed)."""
    from workers import tasks

    if settings.CELERY_TASK_ALWAYS_EAGER:
        tasks.node_launch.apply(args=[node, job_id])
    else:
        tasks.node_launch.apply_async(args=[node, job_id], queue=node_queue(node))


def control(node: str, job_id: int, action: str) -> None:
    """Ask ``node``'s agent to ``pause``, ``resume`` or ``kill`` job ``job_id``."""
    from workers import tasks

    if settings.CELERY_TASK_ALWAYS_EAGER:
        tasks.node_control.apply(args=[node, job_id, action])
    else:
        tasks.node_control.apply_async(args=[node, job_id, action], queue=node_queue(node))
