"""Preemption by hand (staff: API and job page) and the time limit in the scheduler's view of
a job. The live effect on the node is tested in tests/workers/test_preemption.py."""

from __future__ import annotations

import pytest

from portal.core import scheduling
from portal.core.adapters import job_to_domain
from portal.core.models import (
    ApplicationProfile,
    Job,
    JobEvent,
    Node,
    OutboxMessage,
    Placement,
    PlacementPart,
)

pytestmark = pytest.mark.django_db


def _running(owner, state: str = "RUNNING") -> Job:
    node = Node.objects.get_or_create(name="cpu-1", kind="cpu", cores=4)[0]
    job = Job.objects.create(owner=owner, name="r", command="sleep 60", state=state)
    placement = Placement.objects.create(job=job, attempt=1, node=node, policy="fifo")
    PlacementPart.objects.create(placement=placement, node=node, gpu_indices=[])
    return job


def test_staff_preempt_a_running_job_with_a_reason(staff_api, alice):
    job = _running(alice)
    response = staff_api.post(
        f"/api/v1/jobs/{job.pk}/preempt/", {"reason": "  drain cpu-1  "}, format="json"
    )
    assert response.status_code == 200
    body = response.json()
    assert body["state"] == "PENDING" and body["requeue_count"] == 1
    assert [(a["outcome"], a["end_reason"]) for a in body["attempts"]] == [
        ("preempted", "drain cpu-1")
    ]
    event = JobEvent.objects.get(job=job, to_state="PENDING")
    assert event.actor == "user:sam" and event.message == "preempted: drain cpu-1"
    # The node hears of it at once; a cycle places the job again.
    kinds = set(OutboxMessage.objects.values_list("kind", "target"))
    assert ("nudge", "cpu-1") in kinds and ("schedule", "") in kinds


def test_without_a_reason_the_attempt_says_who_preempted_it(staff_api, alice):
    job = _running(alice, state="PAUSED")
    assert staff_api.post(f"/api/v1/jobs/{job.pk}/preempt/").status_code == 200
    assert Placement.objects.get(job=job).end_reason == "preempted by user:sam"


def test_only_staff_preempt_and_only_placed_jobs(staff_api, alice_api, alice):
    job = _running(alice)
    denied = alice_api.post(f"/api/v1/jobs/{job.pk}/preempt/")
    assert denied.status_code == 403 and Job.objects.get(pk=job.pk).state == "RUNNING"
    pending = Job.objects.create(owner=alice, name="p", command="true")
    conflict = staff_api.post(f"/api/v1/jobs/{pending.pk}/preempt/")
    assert conflict.status_code == 409 and conflict.json()["state"] == "PENDING"
    bad = staff_api.post(f"/api/v1/jobs/{job.pk}/preempt/", {"reason": "a\x00b"}, format="json")
    assert bad.status_code == 400 and "reason" in bad.json()
    assert Job.objects.get(pk=job.pk).state == "RUNNING"  # nothing half-done
    assert staff_api.post("/api/v1/jobs/999999/preempt/").status_code == 404


def test_the_schema_documents_the_preempt_action(staff_api):
    schema = staff_api.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    operation = schema["paths"]["/api/v1/jobs/{id}/preempt/"]["post"]
    assert operation["summary"] == "Preempt a job (staff)"
    assert {"200", "403", "404", "409"} <= set(operation["responses"])
    assert "COSCHED_CHECKPOINT_DIR" in operation["description"]


def test_the_job_page_offers_staff_a_preempt_button(client, staff, alice):
    job = _running(alice)
    client.force_login(alice)
    assert 'id="preempt-form"' not in client.get(f"/jobs/{job.pk}/").content.decode()
    assert client.post(f"/jobs/{job.pk}/preempt/").status_code == 403
    client.force_login(staff)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="preempt-form"' in page
    answer = client.post(f"/jobs/{job.pk}/preempt/", {"reason": "make room"}, follow=True)
    assert answer.status_code == 200
    text = answer.content.decode()
    assert "preempted: it is back in the queue" in text
    assert "make room" in text and "Preempted" in text  # the attempts table
    assert Job.objects.get(pk=job.pk).state == "PENDING"
    again = client.post(f"/jobs/{job.pk}/preempt/", follow=True).content.decode()
    assert "only a placed job is preempted" in again


def test_the_scheduler_sees_the_time_limit_with_or_without_a_profile(alice):
    profile = ApplicationProfile.objects.create(name="p", status="approved")
    plain = Job.objects.create(owner=alice, name="a", command="x", time_limit_s=600)
    profiled = Job.objects.create(
        owner=alice, name="b", command="x", time_limit_s=90, profile=profile
    )
    assert job_to_domain(plain).time_limit_s == 600.0
    assert job_to_domain(Job(owner=alice, name="c")).time_limit_s is None
    pending = {j.id: j for j in scheduling.build_snapshot().state.pending}
    assert pending[str(plain.pk)].time_limit_s == 600.0
    assert pending[str(profiled.pk)].time_limit_s == 90.0
    assert pending[str(profiled.pk)].work_estimate_s("V100") == 90.0
