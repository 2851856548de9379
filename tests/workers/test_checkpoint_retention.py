"""Checkpoint directories are not kept for ever: a node lists the ones it keeps for jobs it does
not run (``SyncRequest.checkpoints``), the portal answers which may go (ended at least
``COSCHED_CHECKPOINT_KEEP_S`` ago, or unknown: ``SyncReply.drop_checkpoints``), and the agent
deletes them. A job that may still resume keeps its own. Real agent, runner and job."""

from __future__ import annotations

# ruff: noqa: F811  (the agent tests' fixtures, imported below, are test arguments here)
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.core.agent_sync import checkpoints_to_drop
from portal.core.models import Job
from tests.workers.test_agent import (  # noqa: F401  (fixtures)
    _clean_store,
    _job,
    _step_until,
    _wait,
    agent,
    backend,
    node,
    transport,
)
from workers.protocol import SyncReply, SyncRequest

DAY = timedelta(days=1)


def ended(owner, state: str, ago: timedelta) -> Job:
    return Job.objects.create(
        owner=owner, name="old", command="true", state=state, finished_at=timezone.now() - ago
    )


def test_the_portal_lets_go_of_checkpoints_of_jobs_ended_long_enough_ago(alice, settings):
    settings.COSCHED = {**settings.COSCHED, "CHECKPOINT_KEEP_S": 2 * 24 * 3600}
    old = ended(alice, "COMPLETED", 3 * DAY)
    failed = ended(alice, "FAILED", 3 * DAY)
    recent = ended(alice, "CANCELLED", DAY / 2)
    pending = Job.objects.create(owner=alice, name="p", command="true")  # may resume from it
    gone = 999_999
    ids = (old.pk, failed.pk, recent.pk, pending.pk, gone)
    assert checkpoints_to_drop(ids, timezone.now()) == tuple(sorted((old.pk, failed.pk, gone)))
    settings.COSCHED = {**settings.COSCHED, "CHECKPOINT_KEEP_S": -1}  # keep for ever
    assert checkpoints_to_drop(ids, timezone.now()) == ()


def test_the_lists_travel_in_the_protocol():
    request = SyncRequest(node="n", instance="i", seq=1, sent_at=0.0, checkpoints=(3, 5))
    assert SyncRequest.from_json(request.to_json()).checkpoints == (3, 5)
    reply = SyncReply("n", 20.0, 1.0, 1.0, drop_checkpoints=(5,))
    assert SyncReply.from_json(reply.to_json()).drop_checkpoints == (5,)


def test_the_agent_deletes_what_the_portal_lets_go_and_keeps_the_rest(alice, node, agent):
    old = ended(alice, "COMPLETED", 30 * DAY)
    recent = ended(alice, "COMPLETED", DAY / 24)
    running = _job(alice, node, "sleep 30")
    _step_until(agent, running, "RUNNING")
    _wait(agent.checkpoint_dir(running.pk).is_dir, what="the runner's checkpoint directory")
    for job_id in (old.pk, recent.pk, 424242):
        (agent.checkpoint_dir(job_id) / "state").mkdir(parents=True)
    (agent.checkpoint_root / "notes").mkdir()  # not a job's: never listed, never deleted
    assert agent.checkpoint_dir(running.pk).is_dir()
    assert running.pk not in agent.idle_checkpoints()  # it runs here

    agent.checkpoint_report_every_s = 0.0
    agent.step()

    kept = sorted(p.name for p in agent.checkpoint_root.iterdir())
    assert kept == sorted(["notes", f"job-{recent.pk}", f"job-{running.pk}"])


def test_the_agent_never_deletes_the_checkpoint_of_a_job_it_runs(alice, node, agent):
    running = _job(alice, node, "sleep 30")
    _step_until(agent, running, "RUNNING")
    _wait(agent.checkpoint_dir(running.pk).is_dir, what="the runner's checkpoint directory")
    agent._drop_checkpoints((running.pk,))  # an answer older than the launch
    assert agent.checkpoint_dir(running.pk).is_dir()


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice-ckpt", password="x")
