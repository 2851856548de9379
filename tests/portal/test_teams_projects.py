"""Projects: every job belongs to one, members see its jobs (outsiders get a 404), submission
takes a project the user belongs to (400 otherwise), managers may control members' jobs."""

from __future__ import annotations

import importlib

import pytest

from portal.core.models import Job
from portal.core.selectors import jobs_visible_to, queue_for
from portal.core.services import job_submit
from portal.teams.models import Membership, Project
from portal.teams.services import default_project, project_default_set

pytestmark = pytest.mark.django_db

JOB = {"name": "train", "command": "true", "gpus": 0, "cpus": 1}


@pytest.fixture
def carol(django_user_model):
    return django_user_model.objects.create_user("carol", "carol@example.org", "carol-pass-123")


@pytest.fixture
def lab(alice, bob):
    """alice (manager) and bob (member) share project lab; carol is an outsider."""
    project = Project.objects.create(name="lab")
    Membership.objects.create(project=project, user=alice, role=Membership.Role.MANAGER)
    Membership.objects.create(project=project, user=bob)
    return project


def _client(user):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user=user)
    return client


def test_a_job_without_a_project_goes_to_the_owners_personal_project(alice):
    job = Job.objects.create(owner=alice, name="x", command="true")
    assert job.project.personal_of == alice
    assert job.project.memberships.get().role == Membership.Role.MANAGER
    again = job_submit(alice, **JOB)[0]
    assert again.project == job.project


def test_a_configured_default_project_is_used(alice, lab):
    project_default_set(alice, lab)
    assert default_project(alice) == lab
    assert job_submit(alice, **JOB)[0].project == lab


def test_the_default_is_the_marked_membership_personal_or_not(alice, bob, lab):
    # One query reads both candidates (issue 27); the marked membership wins either way.
    personal = default_project(alice)  # created on first use, nothing marked yet
    assert personal.personal_of == alice
    project_default_set(alice, personal)  # the personal project marked as the default
    assert default_project(alice) == personal
    project_default_set(alice, lab)
    assert default_project(alice) == lab
    project_default_set(alice, personal)
    assert default_project(alice) == personal
    # bob's default is still his own: alice's marks are hers.
    assert default_project(bob).personal_of == bob


def test_members_see_the_projects_jobs_outsiders_get_404(alice, bob, carol, lab):
    job = job_submit(bob, project="lab", **JOB)[0]
    mine = job_submit(bob, **JOB)[0]  # bob's personal project: alice does not see it
    assert set(jobs_visible_to(alice)) == {job}
    assert _client(alice).get(f"/api/v1/jobs/{job.pk}/").status_code == 200
    assert _client(alice).get(f"/api/v1/jobs/{mine.pk}/").status_code == 404
    assert _client(carol).get(f"/api/v1/jobs/{job.pk}/").status_code == 404
    assert _client(carol).get("/api/v1/jobs/").json()["count"] == 0
    assert _client(carol).get(f"/api/v1/jobs/{job.pk}/log/").status_code == 404
    assert _client(carol).get(f"/api/v1/jobs/{job.pk}/series/").status_code == 404
    listed = _client(alice).get("/api/v1/jobs/").json()
    assert [row["project"] for row in listed["results"]] == ["lab"]


def test_members_see_project_jobs_in_the_queue_outsiders_do_not(alice, carol, lab, bob):
    job_submit(bob, project="lab", **JOB)
    alice_rows, _ = queue_for(alice)
    carol_rows, _ = queue_for(carol)
    assert alice_rows[0]["name"] == "train" and alice_rows[0]["project"] == "lab"
    assert carol_rows[0]["name"] is None and carol_rows[0]["project"] is None


def test_browser_pages_follow_the_same_rule(client, alice, carol, lab, bob):
    job = job_submit(bob, project="lab", **JOB)[0]
    client.force_login(alice)
    assert client.get(f"/jobs/{job.pk}/").status_code == 200
    assert b"train" in client.get("/jobs/").content
    client.force_login(carol)
    assert client.get(f"/jobs/{job.pk}/").status_code == 404
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 404


def test_only_owner_managers_and_staff_may_cancel(alice, bob, lab, django_user_model):
    dave = django_user_model.objects.create_user("dave", "d@example.org", "dave-pass-123")
    Membership.objects.create(project=lab, user=dave)
    job = job_submit(bob, project="lab", **JOB)[0]
    assert _client(dave).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 403
    assert Job.objects.get(pk=job.pk).state == "PENDING"
    response = _client(alice).post(f"/api/v1/jobs/{job.pk}/cancel/")  # alice manages lab
    assert response.status_code == 200
    assert response.json()["state"] == "CANCELLED"


def test_submitting_to_a_project_one_is_not_in_is_a_400(carol, lab):
    response = _client(carol).post(
        "/api/v1/jobs/", {**JOB, "project": "lab", "cpus": 0}, format="json"
    )
    assert response.status_code == 400
    body = response.json()
    assert "not a member of a project called 'lab'" in body["project"][0]
    assert "cpus" in body  # every bad field in the one answer
    assert not Job.objects.exists()
    response = _client(carol).post("/api/v1/jobs/", {**JOB, "project": "nope"}, format="json")
    assert response.status_code == 400 and "project" in response.json()
    with pytest.raises(Exception, match="not a member"):
        job_submit(carol, project="lab", **JOB)
    assert not Job.objects.exists()


def test_api_submission_to_a_project(bob, lab):
    response = _client(bob).post("/api/v1/jobs/", {**JOB, "project": "lab"}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["project"] == "lab"
    assert Job.objects.get(pk=response.json()["id"]).project == lab


def test_the_migration_moves_existing_jobs_to_personal_projects(alice, bob):
    from django.apps import apps

    job = Job.objects.create(owner=alice, name="x", command="true")
    Job.objects.filter(pk=job.pk).update(project=None)
    Project.objects.filter(personal_of=alice).delete()
    migration = importlib.import_module("portal.core.migrations.0008_job_project")
    migration.jobs_to_personal_projects(apps, None)
    job.refresh_from_db()
    assert job.project.personal_of == alice
    assert job.project.name == "alice"
    assert Membership.objects.filter(project=job.project, user=alice, role="manager").exists()


def test_the_submit_form_offers_the_users_projects(client, alice, bob, carol, lab):
    client.force_login(bob)
    html = client.get("/jobs/new/").content.decode()
    assert '<option value="lab"' in html and '<option value="bob" selected' in html
    form = {"name": "f", "command": "true", "gpus": "0", "cpus": "1", "priority": "0"}
    response = client.post("/jobs/new/", {**form, "project": "lab"})
    assert response.status_code == 302
    assert Job.objects.get(name="f").project == lab
    client.force_login(carol)
    response = client.post("/jobs/new/", {**form, "name": "g", "project": "lab"})
    assert response.status_code == 400
    assert "Select a valid choice" in response.content.decode()
    assert not Job.objects.filter(name="g").exists()


def test_admin_manages_projects_members_and_quotas(client, staff, alice, lab):
    from portal.core.models import Gpu, Node
    from portal.teams.models import ProjectQuota

    client.force_login(staff)
    assert client.get("/admin/teams/project/").status_code == 200
    assert client.get(f"/admin/teams/project/{lab.pk}/change/").status_code == 200
    node = Node.objects.create(name="n", kind="gpu", cores=4, memory_mb=1)
    Gpu.objects.create(node=node, index=0, model="Quadro-X", memory_mb=1000)
    quota = ProjectQuota(project=lab, gpu_model="v100", guaranteed_gpus=2)
    quota.full_clean()
    assert quota.gpu_model == "V100"  # the catalogue's spelling, which the scheduler matches
    ProjectQuota(project=lab, gpu_model="Quadro-X", guaranteed_gpus=1).full_clean()
    with pytest.raises(Exception, match="unknown GPU model 'H900'"):
        ProjectQuota(project=lab, gpu_model="H900", guaranteed_gpus=1).full_clean()


def test_deleting_a_user_deletes_their_jobs_and_personal_project(alice, bob, lab):
    job_submit(alice, **JOB)  # alice's personal project
    job_submit(alice, project="lab", **JOB)
    kept = job_submit(bob, project="lab", **JOB)[0]
    alice.delete()
    assert not Project.objects.filter(name="alice").exists()
    assert list(Job.objects.all()) == [kept]
    with pytest.raises(Exception, match="restricted|protected|referenced"):
        lab.delete()  # it still has bob's job
