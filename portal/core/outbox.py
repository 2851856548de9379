"""The dispatch outbox: the messages a state change implies, written in the change's own
transaction and relayed after it commits (docs/reliability.md).

A service calls ``outbox_emit`` inside its transaction; the row commits or rolls back with the
change. After commit, the change delivers its own messages (each claimed by its DELETE, no
scan of the table); ``outbox_relay`` delivers everything due, periodically
(beat's ``cosched.outbox_relay``, every agent sync, the embedded loop), so a message the
broker refused is retried when it is back. A submit, cancel, pause or resume therefore succeeds
while the broker is down and takes effect when it returns.

Two kinds, neither required for correctness (a periodic cycle and a periodic sync catch up):

- ``schedule``: run a scheduling cycle soon. With a broker: one ``cosched.schedule_cycle`` task
  on the ``scheduler`` queue, unless one is queued and not started yet (a marker key coalesces a
  burst of 200 submissions into a few cycles); embedded: wake the in-process loop.
- ``nudge`` (``target`` = a node): make that node's agent sync now. With a broker: a Redis
  PUBLISH on ``workers.protocol.nudge_channel(node)``; embedded: wake the in-process loop. A
  nudge carries nothing, so a forged one only costs the agent a request.

Without a broker and without an in-process loop (a management shell, the unit tests) there is
nobody to tell: due messages are dropped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from portal.core.models import OutboxMessage
from workers.protocol import nudge_channel

log = logging.getLogger(__name__)

SCHEDULER_QUEUE = "scheduler"
SCHEDULE_TASK = "cosched.schedule_cycle"
# While this key exists a cycle is queued and has not started: no need to queue another.
CYCLE_PENDING_KEY = "cosched:cycle-queued"
CYCLE_PENDING_TTL_S = 30
# A failed delivery is tried again after FIRST_RETRY_S, then twice as long each time, up to
# MAX_BACKOFF_S.
FIRST_RETRY_S = 0.5
MAX_BACKOFF_S = 30.0
RELAY_BATCH = 500

_waker: Callable[[str], None] | None = None
_relay_lock = threading.Lock()
_redis_client: Any = None


def set_local_waker(waker: Callable[[str], None] | None) -> None:
    """The embedded loop registers how to wake it (None unregisters): it then receives both
    kinds of message."""
    global _waker
    _waker = waker


def has_local_waker() -> bool:
    return _waker is not None


def outbox_emit(kind: str, target: str = "", reason: str = "") -> None:
    """Queue one message in the current transaction (relayed after commit). Call it inside the
    ``transaction.atomic`` block of the change it follows from."""
    message = OutboxMessage.objects.create(
        kind=kind, target=target, reason=reason[:200], next_try_at=timezone.now()
    )
    transaction.on_commit(lambda: _relay_after_commit(message))


def emit_schedule(reason: str) -> None:
    outbox_emit(OutboxMessage.Kind.SCHEDULE, "", reason)


def emit_nudges(nodes: set[str] | list[str] | tuple[str, ...], reason: str) -> None:
    for node in sorted(set(nodes)):
        outbox_emit(OutboxMessage.Kind.NUDGE, node, reason)


def _relay_after_commit(message: OutboxMessage) -> None:
    """Deliver the message a change just committed, and only that one.

    A relay of every due message (a transaction that locks and reads the table) cost each
    submission about a sixth of its time under a CI farm's load (issue 27); this is one DELETE
    in a transaction. The DELETE claims the row: if a periodic relay delivered it first there is
    nothing left to claim and nothing is sent twice; if the delivery fails the DELETE rolls back
    and the message stays for the periodic relays, with its delay. The row lock is held while
    it is sent, as ``outbox_relay`` does."""
    try:
        with transaction.atomic():
            if not OutboxMessage.objects.filter(pk=message.pk).delete()[0]:
                return  # a periodic relay took it
            delivered, failed = _deliver([message])
            if failed:
                raise _Undelivered(failed)
    except _Undelivered as undelivered:
        _back_off(undelivered.failed)
    except Exception:  # never turn a committed change into an error for its caller
        log.exception("outbox relay after commit failed; the periodic relay will retry")


class _Undelivered(Exception):
    def __init__(self, failed: list[tuple[OutboxMessage, str]]) -> None:
        super().__init__(f"{len(failed)} message(s) not delivered")
        self.failed = failed


def outbox_due() -> bool:
    """Is any message due for delivery now (a cheap check before a relay)?"""
    return OutboxMessage.objects.filter(next_try_at__lte=timezone.now()).exists()


def outbox_relay(limit: int = RELAY_BATCH) -> int:
    """Deliver the due messages (oldest first, at most ``limit``); returns how many went out.

    A message whose delivery fails stays, with a growing delay (``FIRST_RETRY_S``, doubling up
    to ``MAX_BACKOFF_S``); the rest of its kind waits for the next relay. Safe to run in several
    processes at once: rows are claimed with ``SELECT ... FOR UPDATE SKIP LOCKED`` where the
    database has it, and a duplicate delivery is harmless anyway."""
    # Where rows can be claimed (SKIP LOCKED), relays run in parallel; elsewhere (SQLite: one
    # process) one at a time.
    serial = not connection.features.has_select_for_update_skip_locked
    if serial and not _relay_lock.acquire(timeout=10):
        return 0
    try:
        with transaction.atomic():
            rows = OutboxMessage.objects.filter(next_try_at__lte=timezone.now()).order_by("id")
            if not serial:
                rows = rows.select_for_update(skip_locked=True)
            batch = list(rows[:limit])
            if not batch:
                return 0
            delivered, failed = _deliver(batch)
            if delivered:
                OutboxMessage.objects.filter(pk__in=delivered).delete()
            _back_off(failed)
        return len(delivered)
    finally:
        if serial:
            _relay_lock.release()


def _back_off(failed: list[tuple[OutboxMessage, str]]) -> None:
    """Count a failed try of each message and make it due again later (doubling the delay)."""
    now = timezone.now()
    for row, error in failed:
        delay = min(MAX_BACKOFF_S, FIRST_RETRY_S * 2**row.tries)
        OutboxMessage.objects.filter(pk=row.pk).update(
            tries=row.tries + 1,
            next_try_at=now + timedelta(seconds=delay),
            last_error=error[:2000],
        )


def _deliver(batch: list[OutboxMessage]) -> tuple[list[int], list[tuple[OutboxMessage, str]]]:
    """Send a batch: one cycle request for all ``schedule`` rows, one nudge per node. Returns
    (delivered ids, [(row, error)] of the ones that failed)."""
    delivered: list[int] = []
    failed: list[tuple[OutboxMessage, str]] = []
    schedules = [m for m in batch if m.kind == OutboxMessage.Kind.SCHEDULE]
    nudges: dict[str, list[OutboxMessage]] = {}
    for m in batch:
        if m.kind == OutboxMessage.Kind.NUDGE:
            nudges.setdefault(m.target, []).append(m)
    if schedules:
        try:
            _send_schedule(schedules[-1].reason)
            delivered += [m.pk for m in schedules]
        except Exception as exc:
            failed += [(m, f"{type(exc).__name__}: {exc}") for m in schedules]
    broker_down = False
    for node, rows in sorted(nudges.items()):
        if broker_down:
            failed += [(m, "not tried: the broker failed for an earlier nudge") for m in rows]
            continue
        try:
            _send_nudge(node, rows[-1].reason)
            delivered += [m.pk for m in rows]
        except Exception as exc:
            broker_down = True
            failed += [(m, f"{type(exc).__name__}: {exc}") for m in rows]
    return delivered, failed


def _redis() -> Any:
    global _redis_client
    if _redis_client is None or getattr(_redis_client, "_cosched_url", None) != settings.REDIS_URL:
        import redis

        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_connect_timeout=1.0, socket_timeout=2.0
        )
        client._cosched_url = settings.REDIS_URL
        _redis_client = client
    return _redis_client


def _send_schedule(reason: str) -> None:
    if _waker is not None:
        _waker(reason)
        return
    if settings.CELERY_TASK_ALWAYS_EAGER:
        return  # no broker, no loop: nobody to tell
    client = _redis()
    # The marker first: a cycle clears it as it starts, so it must exist before the task does.
    if not client.set(CYCLE_PENDING_KEY, reason or "1", nx=True, ex=CYCLE_PENDING_TTL_S):
        return  # a cycle is queued and has not started: it will see this change
    from portal.celery import app

    options = {"kwargs": {"reason": reason}, "queue": SCHEDULER_QUEUE, "retry": False}
    try:
        if app.conf.broker_url == settings.REDIS_URL:
            app.send_task(SCHEDULE_TASK, **options)  # the app's pooled connection
        else:  # settings changed since the app was configured (tests)
            with app.connection_for_write(settings.REDIS_URL) as connection:
                app.send_task(SCHEDULE_TASK, connection=connection, **options)
    except Exception:
        client.delete(CYCLE_PENDING_KEY)  # no cycle is queued after all
        raise


def _send_nudge(node: str, reason: str) -> None:
    if _waker is not None:
        _waker(f"nudge {node}: {reason}")
        return
    if settings.CELERY_TASK_ALWAYS_EAGER:
        return
    _redis().publish(nudge_channel(node), "sync")


def clear_cycle_marker() -> None:
    """Called by a cycle as it starts: later triggers must queue a new cycle."""
    if settings.CELERY_TASK_ALWAYS_EAGER:
        return
    try:
        _redis().delete(CYCLE_PENDING_KEY)
    except Exception:
        log.warning("could not clear the cycle marker (Redis down?); it expires by itself")
