"""Jobs list and detail pages: whose jobs show, filters, pagination, cancel."""

from __future__ import annotations

import pytest
from django.contrib import admin

from portal.core.models import Job, Node, Placement
from portal.core.services import job_submit, job_transition
from portal.core.states import JobState
from portal.front.views import JOBS_PER_PAGE

pytestmark = pytest.mark.django_db


def submit(owner, name="job", **fields):
    fields = {"command": "python train.py", **fields}
    job, _ = job_submit(owner, name=name, **fields)
    return job


@pytest.fixture
def alice_client(client, alice):
    client.force_login(alice)
    return client


def test_alice_sees_only_her_jobs(alice_client, alice, bob):
    submit(alice, "alice-train")
    submit(bob, "bob-secret")
    html = alice_client.get("/jobs/").content.decode()
    assert "alice-train" in html
    assert "bob-secret" not in html
    assert "<th>Owner</th>" not in html


def test_staff_see_every_job_with_its_owner(client, staff, alice, bob):
    submit(alice, "alice-train")
    submit(bob, "bob-secret")
    client.force_login(staff)
    html = client.get("/jobs/").content.decode()
    assert "alice-train" in html and "bob-secret" in html
    assert "<th>Owner</th>" in html
    assert "All jobs" in html


def test_staff_can_search_by_owner(client, staff, alice, bob):
    submit(alice, "alice-train")
    submit(bob, "bob-train")
    client.force_login(staff)
    html = client.get("/jobs/?q=bob").content.decode()
    assert "bob-train" in html and "alice-train" not in html


def test_no_jobs_yet_shows_how_to_submit_one(alice_client):
    html = alice_client.get("/jobs/").content.decode()
    assert "No jobs yet" in html
    assert 'href="/jobs/new/"' in html
    assert 'href="/account/"' in html


def test_state_filter_and_counts(alice_client, alice):
    submit(alice, "waiting")
    job_transition(submit(alice, "stopped"), JobState.CANCELLED, actor="test")
    html = alice_client.get("/jobs/?state=CANCELLED").content.decode()
    assert "stopped" in html and "waiting" not in html
    assert 'Cancelled <span class="count">1</span>' in html
    assert 'Pending <span class="count">1</span>' in html
    assert 'All <span class="count">2</span>' in html


def test_a_filter_with_no_match_says_so_and_offers_a_way_back(alice_client, alice):
    submit(alice, "waiting")
    html = alice_client.get("/jobs/?state=FAILED").content.decode()
    assert "No failed jobs" in html
    assert 'href="/jobs/"' in html


def test_an_unknown_state_is_ignored_not_an_error(alice_client, alice):
    submit(alice, "waiting")
    response = alice_client.get("/jobs/?state=BOGUS")
    assert response.status_code == 200
    assert "waiting" in response.content.decode()


def test_search_by_name(alice_client, alice):
    submit(alice, "resnet-nightly")
    submit(alice, "lammps-melt")
    html = alice_client.get("/jobs/?q=resnet").content.decode()
    assert "resnet-nightly" in html and "lammps-melt" not in html


def test_pagination_keeps_the_filter(alice_client, alice):
    for i in range(JOBS_PER_PAGE + 3):
        submit(alice, f"sweep-{i:03d}")
    first = alice_client.get("/jobs/?state=PENDING").content.decode()
    assert f"Page 1 of 2 · {JOBS_PER_PAGE + 3} jobs" in first
    assert "?state=PENDING&amp;page=2" in first
    second = alice_client.get("/jobs/?state=PENDING&page=2").content.decode()
    assert "sweep-000" in second and "sweep-002" in second
    assert f"sweep-{JOBS_PER_PAGE + 2:03d}" not in second
    assert alice_client.get("/jobs/?page=99").status_code == 200  # clamps to the last page


def test_job_detail_shows_parameters_resources_and_timeline(alice_client, alice):
    job = submit(alice, "resnet", gpus=2, gpu_memory_mb=8000, params={"batch_size": 64})
    html = alice_client.get(f"/jobs/{job.pk}/").content.decode()
    assert "resnet" in html
    assert "&quot;batch_size&quot;: 64" in html
    assert "7.8 GB per GPU" in html
    assert "submitted" in html and "user:alice" in html
    assert "Not placed yet" in html
    assert "Cancel job" in html


def test_job_detail_shows_the_placement_and_its_explanation(alice_client, alice):
    job = submit(alice, "placed", gpus=1)
    node = Node.objects.create(name="gpu-7", kind="gpu")
    gpu = node.gpus.create(index=0, model="A30", memory_mb=24576)
    placement = Placement.objects.create(
        job=job,
        node=node,
        sharing_mode="mps",
        mps_percentage=40,
        policy="coscheml",
        explanation="placed on gpu-7/0 under MPS 40%: predicted interference 1.12",
    )
    placement.gpus.add(gpu)
    job_transition(job, JobState.SCHEDULED, actor="scheduler", message="placed")
    html = alice_client.get(f"/jobs/{job.pk}/").content.decode()
    assert "gpu-7/0 (A30)" in html
    assert "40% of SMs" in html
    assert "predicted interference 1.12" in html


def test_job_detail_shows_exit_code_and_failure_reason(alice_client, alice):
    job = submit(alice, "oom")
    job_transition(
        job, JobState.FAILED, actor="node:gpu-1", exit_code=137, failure_reason="CUDA out of memory"
    )
    html = alice_client.get(f"/jobs/{job.pk}/").content.decode()
    assert "<code>137</code>" in html
    assert "CUDA out of memory" in html
    assert "Cancel job" not in html


def test_bob_gets_404_on_alices_job(client, alice, bob):
    job = submit(alice, "alice-private")
    client.force_login(bob)
    assert client.get(f"/jobs/{job.pk}/").status_code == 404
    assert client.get("/jobs/999999/").status_code == 404


def test_bob_cannot_cancel_alices_job(client, alice, bob):
    job = submit(alice, "alice-private")
    client.force_login(bob)
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 404
    job.refresh_from_db()
    assert job.state == JobState.PENDING


def test_alice_cancels_her_job(alice_client, alice):
    job = submit(alice, "to-cancel")
    response = alice_client.post(f"/jobs/{job.pk}/cancel/", follow=True)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert job.events.last().actor == "user:alice"
    assert f"Job #{job.pk} cancelled." in response.content.decode()


def test_cancel_is_post_only(alice_client, alice):
    job = submit(alice, "to-cancel")
    assert alice_client.get(f"/jobs/{job.pk}/cancel/").status_code == 405
    job.refresh_from_db()
    assert job.state == JobState.PENDING


def test_cancelling_a_finished_job_explains_and_changes_nothing(alice_client, alice):
    job = submit(alice, "done")
    job_transition(job, JobState.CANCELLED, actor="test")
    response = alice_client.post(f"/jobs/{job.pk}/cancel/", follow=True)
    assert "already CANCELLED" in response.content.decode()
    assert job.events.count() == 2


def test_staff_can_open_any_job(client, staff, alice):
    job = submit(alice, "alice-train")
    client.force_login(staff)
    response = client.get(f"/jobs/{job.pk}/")
    assert response.status_code == 200
    assert "Submitted by alice" in response.content.decode()


def test_staff_get_a_link_to_the_job_in_the_admin(client, staff, alice):
    assert admin.site.is_registered(Job), "jobs must be in the admin (the link goes there)"
    job = submit(alice, "alice-train")
    client.force_login(staff)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f"/admin/core/job/{job.pk}/change/" in html
    client.force_login(alice)
    assert "/admin/" not in client.get(f"/jobs/{job.pk}/").content.decode()
