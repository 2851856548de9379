"""What happens after a change the scheduler should react to (called after commit).

With a broker, each trigger queues a scheduling cycle (coalesced). In the embedded default the
in-process loop registers a waker and a trigger only wakes it. With neither (a management
shell, the unit tests), triggers do nothing: jobs stay queued until a cycle runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings

log = logging.getLogger(__name__)

_waker: Callable[[str], None] | None = None


def set_local_waker(waker: Callable[[str], None] | None) -> None:
    """The embedded loop registers how to wake it (None unregisters)."""
    global _waker
    _waker = waker


def has_local_waker() -> bool:
    """True inside the embedded loop's process (in-process agents can be reached)."""
    return _waker is not None


def _kick(reason: str) -> None:
    if _waker is not None:
        _waker(reason)
        return
    if settings.CELERY_TASK_ALWAYS_EAGER:
        return
    from workers import dispatch

    dispatch.schedule_soon(reason)


def on_job_submitted(job_id: int) -> None:
    _kick(f"job {job_id} submitted")


def on_job_finished(job_id: int) -> None:
    _kick(f"job {job_id} finished")


def on_node_changed(name: str) -> None:
    _kick(f"node {name} changed")


def on_job_cancelled(job_id: int) -> None:
    """Kill the process of a cancelled job on the node it was placed on, then reschedule."""
    from portal.core.models import Placement

    last = Placement.objects.filter(job_id=job_id).select_related("node").order_by("-id").first()
    # The agent's kill is idempotent: a job it does not run is ignored.
    if last is not None and (_waker is not None or not settings.CELERY_TASK_ALWAYS_EAGER):
        from workers import dispatch

        dispatch.control(last.node.name, job_id, "kill")
    _kick(f"job {job_id} cancelled")
