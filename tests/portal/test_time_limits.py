"""Time limits in the portal (issue 18): the API, the form, the profile default, the CLI, and
how an attempt stopped at its limit decides the job."""

from __future__ import annotations

import re
import time

import pytest

from portal.core.agent_sync import agent_sync
from portal.core.models import ApplicationProfile, Gpu, Job, Node, Placement, PlacementPart
from portal.core.services import job_submit, profile_import
from portal.front.services import token_create
from tests.portal.test_cli import run_cli
from workers.protocol import AttemptResult, NodeInfo, RunningAttempt, SyncRequest

pytestmark = pytest.mark.django_db


def _submit(api, **fields):
    body = {"name": "t", "command": "sleep 1", **fields}
    return api.post("/api/v1/jobs/", body, format="json")


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        ("2h", 7200),
        (7200, 7200),
        ("7200", 7200),
        ("90s", 90),
        ("1-00:00:00", 86400),
        ("30:00", 1800),
    ],
)
def test_the_api_takes_every_form_and_reads_back_seconds(alice_api, given, seconds):
    response = _submit(alice_api, time_limit=given)
    assert response.status_code == 201, response.json()
    assert response.json()["time_limit"] == seconds
    job = Job.objects.get(pk=response.json()["id"])
    assert job.time_limit_s == seconds
    assert alice_api.get(f"/api/v1/jobs/{job.pk}/").json()["time_limit"] == seconds


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("soon", "is not a duration"),
        ("0", "at least 1 s"),
        (-5, "at least 1 s"),
        ("400d", "longer than"),
        ("5:61", "up to 59"),
        (True, "expected a duration"),
        ([1], "expected a duration"),
        (1.5, "whole number"),
    ],
)
def test_a_bad_time_limit_is_a_400_naming_the_field_and_nothing_is_stored(
    alice_api, given, message
):
    response = _submit(alice_api, time_limit=given, cpus=0)
    assert response.status_code == 400
    errors = response.json()
    assert message in " ".join(errors["time_limit"])
    assert "cpus" in errors  # every bad field in the one answer
    assert not Job.objects.exists()


def test_no_time_limit_is_null_and_the_schema_documents_the_field(alice_api):
    response = _submit(alice_api)
    assert response.status_code == 201 and response.json()["time_limit"] is None
    schema = alice_api.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    field = schema["components"]["schemas"]["Job"]["properties"]["time_limit"]
    assert "1-00:00:00" in field["description"] and field["nullable"] is True


def test_a_profile_gives_its_default_time_limit_unless_the_job_gives_one(alice, alice_api):
    imported = profile_import(
        '[{"name": "limited", "kind": "hpc", "default_time_limit_s": "30m"}]',
        fmt="json",
        status=ApplicationProfile.Status.APPROVED,
    )
    profile = imported.created[0]
    assert profile.default_time_limit_s == 1800
    default = _submit(alice_api, profile=profile.pk)
    assert default.status_code == 201 and default.json()["time_limit"] == 1800
    own = _submit(alice_api, profile="limited", time_limit="5m")
    assert own.json()["time_limit"] == 300
    job, _ = job_submit(alice, name="direct", command="true", profile=profile)
    assert job.time_limit_s == 1800


def test_the_profile_default_shows_on_its_page_and_in_the_admin(client, staff):
    profile = ApplicationProfile.objects.create(
        name="p", status="approved", default_time_limit_s=5400
    )
    client.force_login(staff)
    page = client.get(f"/profiles/{profile.pk}/").content.decode()
    assert re.search(r'id="profile-time-limit">01:30:00<', page)
    admin = client.get(f"/admin/core/applicationprofile/{profile.pk}/change/").content.decode()
    assert 'name="default_time_limit_s" value="5400"' in admin


def test_a_profile_import_refuses_a_bad_default_time_limit():
    from portal.core.importers import ProfileImportError

    with pytest.raises(ProfileImportError) as info:
        profile_import('[{"name": "bad", "default_time_limit_s": "forever"}]', fmt="json")
    assert info.value.errors[0].field == "default_time_limit_s"
    assert not ApplicationProfile.objects.exists()


def test_the_form_takes_a_time_limit_and_names_a_bad_one(client, alice):
    client.force_login(alice)
    page = client.get("/jobs/new/").content.decode()
    assert 'name="time_limit"' in page
    bad = client.post("/jobs/new/", {"name": "f", "command": "true", "time_limit": "45x"})
    assert bad.status_code == 400
    assert "is not a duration" in bad.content.decode() and not Job.objects.exists()
    good = client.post("/jobs/new/", {"name": "f", "command": "true", "time_limit": "45m"})
    assert good.status_code == 302
    job = Job.objects.get()
    assert job.time_limit_s == 2700
    detail = client.get(f"/jobs/{job.pk}/").content.decode()
    assert re.search(r'id="job-time-limit">00:45:00', detail)


def _running_on_node(owner, limit_s: int) -> tuple[Job, int]:
    """A RUNNING job with one attempt on node gpu-1 (registered through a sync)."""
    info = NodeInfo(
        kind="gpu", cores=8, memory_mb=1024, backend="virtual",
        gpus=({"index": 0, "model": "A30", "memory_mb": 24576},),
    )  # fmt: skip
    agent_sync(SyncRequest(node="gpu-1", instance="t", seq=1, sent_at=time.time(), info=info))
    node = Node.objects.get(name="gpu-1")
    job = Job.objects.create(
        owner=owner, name="long", command="sleep 99", gpus=1, state="SCHEDULED",
        time_limit_s=limit_s,
    )  # fmt: skip
    placement = Placement.objects.create(job=job, attempt=1, node=node, policy="test")
    placement.gpus.add(Gpu.objects.get(node=node, index=0))
    PlacementPart.objects.create(placement=placement, node=node, gpu_indices=[0])
    reply = agent_sync(SyncRequest(node="gpu-1", instance="t", seq=2, sent_at=time.time()))
    assert [a.time_limit_s for a in reply.desired] == [float(limit_s)]
    running = RunningAttempt(job.pk, 1, "running", time.time(), 4242)
    agent_sync(
        SyncRequest(node="gpu-1", instance="t", seq=3, sent_at=time.time(), running=(running,))
    )
    return job, 4


def test_an_attempt_stopped_at_its_limit_fails_the_job_with_reason_time_limit(client, alice):
    job, seq = _running_on_node(alice, 60)
    detail = "time limit 00:01:00 reached: the runner stopped the job (killed by SIGTERM)"
    result = AttemptResult(job.pk, 1, "time_limit", time.time(), -15, detail)
    agent_sync(
        SyncRequest(node="gpu-1", instance="t", seq=seq, sent_at=time.time(), results=(result,))
    )
    job.refresh_from_db()
    assert job.state == "FAILED" and job.exit_code == -15
    assert job.failure_reason.startswith("time limit 00:01:00 reached")
    assert job.end_label == "time limit"
    assert job.placements.get().outcome == "failed"
    assert client_json(alice, job)["end_label"] == "time limit"
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert re.search(r'id="job-state">FAILED \(time limit\)</span>', page)


def client_json(user, job: Job) -> dict:
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(user=user)
    return api.get(f"/api/v1/jobs/{job.pk}/").json()


def test_an_attempt_stopped_by_a_runner_without_the_words_still_says_time_limit(alice):
    job, seq = _running_on_node(alice, 60)
    result = AttemptResult(job.pk, 1, "time_limit", time.time(), -9, "stopped (killed by SIGKILL)")
    agent_sync(
        SyncRequest(node="gpu-1", instance="t", seq=seq, sent_at=time.time(), results=(result,))
    )
    job.refresh_from_db()
    assert job.failure_reason == "time limit: stopped (killed by SIGKILL)"
    assert job.end_label == "time limit" and job.exit_code == -9


def test_cosched_submit_time_limit_overrides_the_job_file(live_server, alice, tmp_path):
    _, key = token_create(alice, name="ci")
    job_file = tmp_path / "job.yaml"
    job_file.write_text("name: limited\ncommand: sleep 5\ntime_limit: 2h\n")
    from_file = run_cli("submit", str(job_file), url=live_server.url, token=key)
    assert from_file.code == 0, from_file.err
    first = Job.objects.get()
    assert first.time_limit_s == 7200
    flag = run_cli(
        "submit", str(job_file), "--time-limit", "1-00:00:00", url=live_server.url, token=key
    )
    assert flag.code == 0, flag.err
    second = Job.objects.exclude(pk=first.pk).get()  # a new job, not the first one replayed
    assert second.time_limit_s == 86400
    status = run_cli("status", str(second.pk), url=live_server.url, token=key)
    assert re.search(r"time limit\s+1-00:00:00 per attempt", status.out)
    bad = run_cli("submit", str(job_file), "--time-limit", "5x", url=live_server.url, token=key)
    assert bad.code == 2 and "is not a duration" in bad.err
    bad_file = tmp_path / "bad.yaml"
    bad_file.write_text("name: x\ncommand: true\ntime_limit: ever\n")
    refused = run_cli("submit", str(bad_file), url=live_server.url, token=key)
    assert refused.code == 2 and "time_limit" in refused.err
    assert Job.objects.count() == 2
    helped = run_cli("submit", "--help", url=live_server.url, token=key)
    assert "--time-limit" in helped.out and "time_limit: 2h" in helped.out
