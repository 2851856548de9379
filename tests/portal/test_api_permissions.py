"""Who sees what: alice and bob see only their own jobs (another user's job is a 404, also for
cancel); staff see and cancel all; profiles: approved ones for users, all for staff, writes for
staff only."""

from __future__ import annotations

import pytest

from portal.core import services
from portal.core.models import ApplicationProfile, Job
from portal.core.states import JobState

pytestmark = pytest.mark.django_db


@pytest.fixture
def bobs_job(bob):
    return services.job_submit(bob, name="bob-job", command="true")[0]


@pytest.fixture
def alices_job(alice):
    return services.job_submit(alice, name="alice-job", command="true")[0]


def test_alice_does_not_see_bobs_job_in_her_list(alice_api, bobs_job, alices_job):
    names = [j["name"] for j in alice_api.get("/api/v1/jobs/").json()["results"]]
    assert names == ["alice-job"]


def test_alice_cannot_retrieve_bobs_job(alice_api, bobs_job):
    assert alice_api.get(f"/api/v1/jobs/{bobs_job.pk}/").status_code == 404


def test_alice_cannot_cancel_bobs_job(alice_api, bobs_job):
    assert alice_api.post(f"/api/v1/jobs/{bobs_job.pk}/cancel/").status_code == 404
    bobs_job.refresh_from_db()
    assert bobs_job.state == JobState.PENDING


def test_a_missing_job_looks_the_same_as_someone_elses(alice_api, bobs_job):
    missing = alice_api.get("/api/v1/jobs/999999/")
    other = alice_api.get(f"/api/v1/jobs/{bobs_job.pk}/")
    assert missing.status_code == other.status_code == 404


def test_staff_see_everybodys_jobs(staff_api, bobs_job, alices_job):
    names = {j["name"] for j in staff_api.get("/api/v1/jobs/").json()["results"]}
    assert names == {"alice-job", "bob-job"}
    assert staff_api.get(f"/api/v1/jobs/{bobs_job.pk}/").json()["owner"] == "bob"


def test_staff_can_cancel_bobs_job(staff_api, bobs_job):
    response = staff_api.post(f"/api/v1/jobs/{bobs_job.pk}/cancel/")
    assert response.status_code == 200
    bobs_job.refresh_from_db()
    assert bobs_job.state == JobState.CANCELLED
    assert bobs_job.events.last().actor == "user:sam"


def test_a_job_is_always_created_for_the_caller(alice_api, alice):
    response = alice_api.post("/api/v1/jobs/", {"name": "x", "command": "true"}, format="json")
    assert Job.objects.get(pk=response.json()["id"]).owner == alice


@pytest.fixture
def profiles(staff):
    return {
        status: ApplicationProfile.objects.create(name=f"app-{status}", status=status)
        for status in ("draft", "approved", "retired")
    }


def test_users_read_only_approved_profiles(alice_api, profiles):
    names = [p["name"] for p in alice_api.get("/api/v1/profiles/").json()["results"]]
    assert names == ["app-approved"]
    assert alice_api.get(f"/api/v1/profiles/{profiles['draft'].pk}/").status_code == 404
    assert alice_api.get(f"/api/v1/profiles/{profiles['approved'].pk}/").status_code == 200


def test_staff_read_all_profiles(staff_api, profiles):
    names = {p["name"] for p in staff_api.get("/api/v1/profiles/").json()["results"]}
    assert names == {"app-draft", "app-approved", "app-retired"}
    only = staff_api.get("/api/v1/profiles/?status=retired").json()["results"]
    assert [p["name"] for p in only] == ["app-retired"]


def test_users_cannot_write_profiles(alice_api, profiles):
    approved = profiles["approved"]
    assert alice_api.post("/api/v1/profiles/", {"name": "x"}, format="json").status_code == 403
    url = f"/api/v1/profiles/{approved.pk}/"
    assert alice_api.patch(url, {"cpu_time_s": 1}, format="json").status_code == 403
    assert alice_api.delete(url).status_code == 403
    assert alice_api.post(f"{url}retire/").status_code == 403
    # Refused (staff only, checked before the profile is looked up), not "not found": a 404
    # would also be the answer of a missing route.
    draft = profiles["draft"]
    assert alice_api.post(f"/api/v1/profiles/{draft.pk}/approve/").status_code == 403
    draft.refresh_from_db()
    assert draft.status == "draft"
    assert (
        alice_api.post("/api/v1/profiles/import/", {"profiles": []}, format="json").status_code
        == 403
    )
    approved.refresh_from_db()
    assert approved.status == "approved"


def test_users_read_nodes_and_gpus(alice_api):
    assert alice_api.get("/api/v1/nodes/").status_code == 200
    assert alice_api.get("/api/v1/gpus/").status_code == 200
    assert alice_api.post("/api/v1/nodes/", {"name": "n"}, format="json").status_code == 405
