"""The submit form: a valid job is created PENDING; every bad field is shown next to the field
and nothing is stored."""

from __future__ import annotations

import pytest

from portal.core.models import ApplicationProfile, Job, JobEvent, ProfileGpuTime
from portal.core.states import JobState

pytestmark = pytest.mark.django_db

URL = "/jobs/new/"
GOOD = {
    "name": "resnet-nightly",
    "command": "python train.py --epochs 3",
    "gpus": "1",
    "gpu_memory_mb": "8000",
    "cpus": "4",
    "memory_mb": "16000",
    "kind": "dl-train",
    "priority": "5",
    "params": '{"batch_size": 64}',
    "submit_token": "0123456789abcdef",
}


@pytest.fixture
def alice_client(client, alice):
    client.force_login(alice)
    return client


@pytest.fixture
def lammps(staff):
    profile = ApplicationProfile.objects.create(
        name="LAMMPS",
        kind="hpc",
        status="approved",
        gpu_memory_max_mb=2272.4,
        batch_size=None,
        dataset="melt",
        args={"steps": 1000},
    )
    ProfileGpuTime.objects.create(profile=profile, gpu_model="V100", time_s=85)
    return profile


def test_the_form_renders_with_every_field(alice_client):
    html = alice_client.get(URL).content.decode()
    for name in [
        "name",
        "profile",
        "command",
        "gpus",
        "gpu_memory_mb",
        "cpus",
        "memory_mb",
        "kind",
        "priority",
        "params",
        "submit_token",
    ]:
        assert f'name="{name}"' in html


def test_a_valid_job_is_created_pending_with_an_event_and_shown(alice_client, alice):
    response = alice_client.post(URL, GOOD)
    job = Job.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/jobs/{job.pk}/"
    assert job.owner == alice
    assert job.state == JobState.PENDING
    assert (job.gpus, job.gpu_memory_mb, job.cpus, job.memory_mb) == (1, 8000, 4, 16000)
    assert (job.kind, job.priority, job.params) == ("dl-train", 5, {"batch_size": 64})
    event = JobEvent.objects.get(job=job)
    assert (event.to_state, event.actor, event.message) == ("PENDING", "user:alice", "submitted")


def test_only_name_and_command_are_needed(alice_client):
    alice_client.post(URL, {"name": "tiny", "command": "echo hi"})
    job = Job.objects.get()
    assert (job.gpus, job.gpu_memory_mb, job.cpus, job.kind, job.priority, job.params) == (
        0,
        None,
        1,
        "other",
        0,
        {},
    )


def test_a_double_post_of_one_form_makes_one_job(alice_client):
    first = alice_client.post(URL, GOOD)
    second = alice_client.post(URL, GOOD, follow=True)
    assert Job.objects.count() == 1
    assert first["Location"] == second.redirect_chain[0][0]
    assert "already submitted" in second.content.decode()


def test_a_profile_fills_in_blank_resources_kind_and_parameters(alice_client, lammps):
    alice_client.post(URL, {"name": "md", "command": "lmp -in in.melt", "profile": lammps.pk})
    job = Job.objects.get()
    assert job.profile == lammps
    assert (job.gpus, job.gpu_memory_mb, job.kind) == (1, 2273, "hpc")
    assert job.params == {"dataset": "melt", "steps": 1000}


def test_values_given_by_hand_win_over_the_profile(alice_client, lammps):
    alice_client.post(
        URL,
        {
            "name": "md",
            "command": "lmp",
            "profile": lammps.pk,
            "gpus": "0",
            "kind": "other",
            "params": '{"steps": 5}',
        },
    )
    job = Job.objects.get()
    assert (job.gpus, job.gpu_memory_mb, job.kind, job.params) == (0, None, "other", {"steps": 5})


def test_fill_in_from_profile_shows_the_values_without_submitting(alice_client, lammps):
    response = alice_client.post(
        URL, {"name": "md", "command": "lmp", "profile": lammps.pk, "prefill": "1"}
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert Job.objects.count() == 0
    assert 'name="gpu_memory_mb" value="2273"' in html
    assert 'name="gpus" value="1"' in html
    assert "&quot;steps&quot;: 1000" in html
    assert "field-error" not in html


def test_a_profile_page_link_preselects_the_profile(alice_client, lammps):
    html = alice_client.get(f"{URL}?profile={lammps.pk}").content.decode()
    assert f'<option value="{lammps.pk}" selected>' in html
    assert 'name="gpu_memory_mb" value="2273"' in html


def test_draft_profiles_are_not_offered(alice_client, lammps):
    draft = ApplicationProfile.objects.create(name="Draft-app", status="draft")
    html = alice_client.get(URL).content.decode()
    assert "LAMMPS" in html and "Draft-app" not in html
    response = alice_client.post(URL, {**GOOD, "profile": draft.pk})
    assert "Select a valid choice" in response.content.decode()
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", "", "This field is required."),
        ("name", "x" * 201, "at most 200 characters"),
        ("command", "", "give a command (or a container image)"),
        ("gpus", "-1", "greater than or equal to 0"),
        ("gpus", "two", "Enter a whole number."),
        ("gpu_memory_mb", "0", "greater than or equal to 1"),
        ("cpus", "0", "greater than or equal to 1"),
        ("memory_mb", "-5", "greater than or equal to 1"),
        ("kind", "quantum", "Select a valid choice"),
        ("priority", "5000", "less than or equal to 1000"),
        ("params", "{not json", "not valid JSON"),
        ("params", "[1, 2]", "must be a JSON object"),
        ("profile", "999999", "Select a valid choice"),
        ("elastic_max_workers", "0", "greater than or equal to 1"),
    ],
)
def test_each_bad_field_shows_its_error_next_to_it_and_stores_nothing(
    alice_client, field, value, message
):
    response = alice_client.post(URL, {**GOOD, field: value})
    assert response.status_code == 400
    html = response.content.decode()
    assert f'id="id_{field}_error"' in html
    error_start = html.index(f'id="id_{field}_error"')
    assert message in html[error_start : error_start + 300]
    assert "Nothing was submitted" in html
    assert Job.objects.count() == 0
    assert JobEvent.objects.count() == 0


def test_business_rules_from_the_service_land_on_their_fields(alice_client):
    response = alice_client.post(
        URL,
        {
            **GOOD,
            "gpus": "0",
            "gpu_memory_mb": "4000",
            "elastic_min_workers": "4",
            "elastic_max_workers": "2",
        },
    )
    html = response.content.decode()
    assert response.status_code == 400
    assert "a CPU-only job (gpus=0) asks no GPU memory" in html
    assert "must be at least elastic_min_workers (4)" in html
    assert Job.objects.count() == 0


def test_the_form_keeps_what_was_typed_after_an_error(alice_client):
    html = alice_client.post(URL, {**GOOD, "gpus": "-1"}).content.decode()
    assert 'value="resnet-nightly"' in html
    assert "python train.py --epochs 3" in html


def test_type_errors_and_rule_errors_show_together(alice_client):
    response = alice_client.post(URL, {**GOOD, "gpus": "-1", "command": ""})
    html = response.content.decode()
    assert 'id="id_gpus_error"' in html
    assert "give a command (or a container image)" in html
    assert Job.objects.count() == 0
