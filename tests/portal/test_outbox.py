"""The dispatch outbox (portal.core.outbox) against the real Redis: messages written with the
change, relayed after commit, kept and retried while the broker is down; and the API's writes
succeeding meanwhile."""

from __future__ import annotations

import base64
import json
import os
import time
from datetime import timedelta

import pytest
import redis
from django.db import transaction
from django.utils import timezone

from portal.core import outbox, services, signed_messages
from portal.core.models import Job, Node, OutboxMessage, Placement, PlacementPart
from workers.protocol import nudge_channel

pytestmark = pytest.mark.django_db

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
DOWN_URL = "redis://127.0.0.1:1/0"  # nothing listens there


@pytest.fixture
def broker(settings):
    """The real broker (the test Redis database, flushed)."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.flushdb()
    except redis.exceptions.ConnectionError:
        pytest.fail(f"Redis is not reachable at {REDIS_URL}: start it (see .ci/run)")
    settings.REDIS_URL = REDIS_URL
    settings.CELERY_TASK_ALWAYS_EAGER = False
    yield client
    client.flushdb()


# The first retry of a failed delivery while the broker is down, in these tests: long enough that
# no retry falls due during a test however loaded the machine is (the default, 0.5 s, did on a
# loaded CI machine, and a message was tried twice).
FIRST_RETRY_S = 20.0


@pytest.fixture
def broker_down(settings, monkeypatch):
    """Redis is down: the broker, and the cache holding the API's rate-limit counters (the
    deployment's backend, as portal.settings configures it with REDIS_URL)."""
    monkeypatch.setattr(outbox, "FIRST_RETRY_S", FIRST_RETRY_S)
    settings.REDIS_URL = DOWN_URL
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.CACHES = {
        "default": {
            "BACKEND": "portal.core.cache.ResilientRedisCache",
            "LOCATION": DOWN_URL,
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 2},
        }
    }


def _queued_tasks(client) -> list[dict]:
    """Celery messages waiting on the scheduler queue (Redis list ``scheduler``): their signed
    bodies (``portal.core.signed_messages``; the task's name is inside)."""
    messages = [json.loads(m) for m in client.lrange(outbox.SCHEDULER_QUEUE, 0, -1)]
    assert all(m["content-type"] == signed_messages.CONTENT_TYPE for m in messages)
    return [signed_messages.loads(base64.b64decode(m["body"])) for m in messages]


def test_a_message_commits_or_rolls_back_with_its_change(alice):
    with transaction.atomic():
        services.job_submit(alice, name="a", command="true")
    assert list(OutboxMessage.objects.values_list("kind", "reason")) == [
        ("schedule", f"job {Job.objects.get().pk} submitted")
    ]
    with pytest.raises(RuntimeError), transaction.atomic():
        services.job_submit(alice, name="b", command="true")
        raise RuntimeError("the change fails")
    assert OutboxMessage.objects.count() == 1 and Job.objects.count() == 1


def test_the_relay_queues_one_cycle_for_a_burst_and_publishes_nudges(alice, broker):
    for i in range(5):
        services.job_submit(alice, name=f"j{i}", command="true")
    outbox.emit_nudges({"gpu-1", "gpu-2"}, "test")
    listener = broker.pubsub()
    listener.subscribe(nudge_channel("gpu-1"))
    # Subscribed before the nudge goes out (Redis confirms it), however slow the machine is.
    deadline = time.monotonic() + 10
    reply = None
    while reply is None and time.monotonic() < deadline:
        reply = listener.get_message(timeout=0.5)
    assert reply is not None and reply["type"] == "subscribe"

    assert outbox.outbox_relay() == 7
    assert not OutboxMessage.objects.exists()
    tasks = _queued_tasks(broker)
    assert [t["task"] for t in tasks] == ["cosched.schedule_cycle"]
    assert broker.exists(outbox.CYCLE_PENDING_KEY)
    deadline = time.monotonic() + 10
    message = None
    while message is None and time.monotonic() < deadline:
        message = listener.get_message(timeout=0.5)
    assert message is not None and message["data"] == b"sync"

    # A cycle is queued and has not started: later changes ride on it.
    services.job_submit(alice, name="late", command="true")
    assert outbox.outbox_relay() == 1 and len(_queued_tasks(broker)) == 1
    outbox.clear_cycle_marker()  # the cycle starts
    services.job_submit(alice, name="later", command="true")
    outbox.outbox_relay()
    assert len(_queued_tasks(broker)) == 2
    listener.close()


def test_a_down_broker_keeps_the_messages_and_they_go_when_it_is_back(alice, broker_down, settings):
    services.job_submit(alice, name="a", command="true")
    before = timezone.now()
    assert outbox.outbox_relay() == 0
    after = timezone.now()
    row = OutboxMessage.objects.get()
    assert row.tries == 1 and "Error" in row.last_error
    # Backs off: due again FIRST_RETRY_S after the failure.
    first_retry = timedelta(seconds=FIRST_RETRY_S)
    assert before + first_retry <= row.next_try_at <= after + first_retry
    assert outbox.outbox_relay() == 0  # not due yet: not even tried
    assert OutboxMessage.objects.get().tries == 1
    # Due again and failing again: the delay doubles.
    OutboxMessage.objects.update(next_try_at=timezone.now())
    before = timezone.now()
    assert outbox.outbox_relay() == 0
    after = timezone.now()
    row = OutboxMessage.objects.get()
    second_retry = timedelta(seconds=min(outbox.MAX_BACKOFF_S, 2 * FIRST_RETRY_S))
    assert row.tries == 2 and before + second_retry <= row.next_try_at <= after + second_retry

    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    settings.REDIS_URL = REDIS_URL
    OutboxMessage.objects.update(next_try_at=row.created_at)
    assert outbox.outbox_relay() == 1
    assert [t["task"] for t in _queued_tasks(client)] == ["cosched.schedule_cycle"]
    client.flushdb()


def test_without_a_broker_the_embedded_loop_is_woken(alice):
    woken: list[str] = []
    outbox.set_local_waker(woken.append)
    try:
        services.job_submit(alice, name="a", command="true")
        outbox.emit_nudges({"cpu-1"}, "why")
        outbox.outbox_relay()
    finally:
        outbox.set_local_waker(None)
    assert woken[0].endswith("submitted") and woken[1] == "nudge cpu-1: why"


def _running_job(owner) -> Job:
    node = Node.objects.create(name="n-1", kind="cpu", cores=4)
    job = Job.objects.create(owner=owner, name="r", command="sleep 9", state="RUNNING")
    placement = Placement.objects.create(job=job, node=node, policy="t")
    PlacementPart.objects.create(placement=placement, node=node, started_at=placement.created_at)
    return job


def test_the_api_submits_pauses_and_cancels_while_the_broker_is_down(
    alice, alice_api, broker_down, django_capture_on_commit_callbacks
):
    from django.core.cache import caches

    # The throttles read it on every call: the deployment's backend, its Redis down.
    assert type(caches["default"]).__name__ == "ResilientRedisCache"
    with django_capture_on_commit_callbacks(execute=True):
        response = alice_api.post("/api/v1/jobs/", {"name": "x", "command": "true"}, format="json")
    assert response.status_code == 201, response.content
    job = _running_job(alice)
    with django_capture_on_commit_callbacks(execute=True):
        assert alice_api.post(f"/api/v1/jobs/{job.pk}/pause/").status_code == 200
        assert alice_api.post(f"/api/v1/jobs/{job.pk}/resume/").status_code == 200
        response = alice_api.post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == "CANCELLED"
    # The messages wait for the broker: a cycle, and nudges for the node that runs the job.
    kinds = sorted(OutboxMessage.objects.values_list("kind", "target"))
    assert ("schedule", "") in kinds and kinds.count(("nudge", "n-1")) == 3
    assert all(m.tries == 1 for m in OutboxMessage.objects.all())


def test_after_commit_a_change_relays_its_own_message_only(
    alice, broker_down, settings, django_capture_on_commit_callbacks
):
    """After commit a change delivers and deletes its own message, and touches no other: what
    waits is for the periodic relays (issue 27: a relay of the whole table after every
    submission cost it a sixth of its time)."""
    with django_capture_on_commit_callbacks(execute=True):
        services.job_submit(alice, name="while-down", command="true")
    waiting = OutboxMessage.objects.get()
    assert waiting.tries == 1  # tried after commit, refused, kept with a delay
    OutboxMessage.objects.update(next_try_at=timezone.now())  # due again

    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    settings.REDIS_URL = REDIS_URL
    with django_capture_on_commit_callbacks(execute=True):
        job, _ = services.job_submit(alice, name="back", command="true")
    assert list(OutboxMessage.objects.values_list("pk", "tries")) == [(waiting.pk, 1)]
    assert [t["kwargs"]["reason"] for t in _queued_tasks(client)] == [f"job {job.pk} submitted"]
    assert outbox.outbox_relay() == 1 and not OutboxMessage.objects.exists()
    client.flushdb()


def test_a_message_a_relay_sent_first_is_not_sent_again_after_commit(
    alice, django_capture_on_commit_callbacks
):
    woken: list[str] = []
    outbox.set_local_waker(woken.append)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            job, _ = services.job_submit(alice, name="a", command="true")
            assert outbox.outbox_relay() == 1  # a periodic relay gets there before the commit hook
    finally:
        outbox.set_local_waker(None)
    assert woken == [f"job {job.pk} submitted"] and not OutboxMessage.objects.exists()
