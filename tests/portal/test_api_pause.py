"""Pause and resume through the API: owner (or staff) only, and only from the right state."""

from __future__ import annotations

import pytest

from portal.core.models import Job, JobEvent
from portal.core.services import job_transition
from portal.core.states import JobState

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(alice):
    job = Job.objects.create(owner=alice, name="train", command="sleep 60")
    job_transition(job, JobState.SCHEDULED, actor="scheduler")
    return job_transition(job, JobState.RUNNING, actor="node:g1")


def test_owner_pauses_and_resumes(alice_api, running):
    r = alice_api.post(f"/api/v1/jobs/{running.pk}/pause/")
    assert r.status_code == 200, r.content
    assert r.json()["state"] == "PAUSED"
    event = JobEvent.objects.filter(job=running, to_state="PAUSED").get()
    assert event.actor == "user:alice"

    again = alice_api.post(f"/api/v1/jobs/{running.pk}/pause/")
    assert again.status_code == 409 and again.json()["state"] == "PAUSED"

    r = alice_api.post(f"/api/v1/jobs/{running.pk}/resume/")
    assert r.status_code == 200 and r.json()["state"] == "RUNNING"
    assert alice_api.post(f"/api/v1/jobs/{running.pk}/resume/").status_code == 409


def test_someone_else_cannot_pause(bob_api, running):
    assert bob_api.post(f"/api/v1/jobs/{running.pk}/pause/").status_code == 404
    running.refresh_from_db()
    assert running.state == JobState.RUNNING


def test_staff_can_pause_any_job(staff_api, running):
    assert staff_api.post(f"/api/v1/jobs/{running.pk}/pause/").status_code == 200


def test_pending_job_cannot_be_paused(alice_api, alice):
    job = Job.objects.create(owner=alice, name="queued", command="true")
    r = alice_api.post(f"/api/v1/jobs/{job.pk}/pause/")
    assert r.status_code == 409 and "only a RUNNING job" in r.json()["detail"]
