"""POST /api/v1/jobs/bulk/: many jobs in one request, all or nothing, with an Idempotency-Key
that makes a retried batch return the jobs of the first try."""

from __future__ import annotations

import pytest

from portal.core.models import Job, JobEvent

pytestmark = pytest.mark.django_db

URL = "/api/v1/jobs/bulk/"


def _jobs(n: int, **extra):
    return [{"name": f"ci-{i}", "command": f"echo {i}", "gpus": 0, **extra} for i in range(n)]


def test_a_batch_is_created_in_order(alice_api, alice):
    response = alice_api.post(URL, {"jobs": _jobs(3)}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["created"] == 3
    assert [j["name"] for j in body["jobs"]] == ["ci-0", "ci-1", "ci-2"]
    assert all(j["state"] == "PENDING" for j in body["jobs"])
    ids = [j["id"] for j in body["jobs"]]
    assert (
        list(Job.objects.filter(pk__in=ids).values_list("owner__username", flat=True))
        == ["alice"] * 3
    )
    assert JobEvent.objects.filter(job_id__in=ids, to_state="PENDING").count() == 3


def test_one_bad_job_refuses_the_whole_batch_naming_each_bad_one(alice_api, bob_api):
    theirs = bob_api.post("/api/v1/jobs/", _jobs(1)[0], format="json").json()["id"]
    batch = _jobs(4)
    batch[1]["gpus"] = -1  # a serializer error
    batch[3]["dependencies"] = f"afterok:{theirs}"  # a business rule: not alice's job
    before = Job.objects.count()
    response = alice_api.post(URL, {"jobs": batch}, format="json")
    assert response.status_code == 400
    errors = response.json()["jobs"]
    assert set(errors) == {"1"} and "gpus" in errors["1"]
    assert Job.objects.count() == before  # the serializer pass created nothing

    batch[1]["gpus"] = 0
    response = alice_api.post(URL, {"jobs": batch}, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()["jobs"]
    assert set(errors) == {"3"} and "dependencies" in errors["3"]
    assert Job.objects.count() == before  # jobs 0-2 passed their checks and were rolled back


def test_limits_and_shape(alice_api):
    assert alice_api.post(URL, {"jobs": []}, format="json").status_code == 400
    too_many = alice_api.post(URL, {"jobs": _jobs(1001)}, format="json")
    assert too_many.status_code == 400 and "jobs" in too_many.json()
    assert alice_api.post(URL, {"jobs": "nope"}, format="json").status_code == 400
    assert Job.objects.count() == 0


def test_a_retried_batch_returns_the_first_jobs(alice_api):
    headers = {"HTTP_IDEMPOTENCY_KEY": "pipeline-812"}
    first = alice_api.post(URL, {"jobs": _jobs(5)}, format="json", **headers)
    assert first.status_code == 201
    again = alice_api.post(URL, {"jobs": _jobs(5)}, format="json", **headers)
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json()["jobs"] == first.json()["jobs"] and again.json()["created"] == 0
    assert Job.objects.count() == 5
    other = alice_api.post(URL, {"jobs": _jobs(5, priority=3)}, format="json", **headers)
    assert other.status_code == 422 and "another batch" in other.json()["detail"]
    assert Job.objects.count() == 5


def test_a_pipeline_submits_500_jobs_in_one_request(alice_api):
    response = alice_api.post(URL, {"jobs": _jobs(500)}, format="json")
    assert response.status_code == 201
    assert response.json()["created"] == 500 == Job.objects.count()


@pytest.mark.django_db(transaction=True)
def test_cosched_submit_a_file_of_jobs(live_server, alice, tmp_path):
    from portal.front.services import token_create
    from tests.portal.test_cli import run_cli

    _, key = token_create(alice, name="ci")
    path = tmp_path / "nightly.yaml"
    path.write_text(
        "jobs:\n"
        "  - {name: a, command: echo a, gpus: 0}\n"
        "  - {name: b, command: echo b, gpus: -2}\n"
        "  - {name: c, command: echo c, gpus: 0}\n"
    )
    refused = run_cli("submit", str(path), url=live_server.url, token=key)
    assert refused.code == 2 and "job 1 (from 0): gpus" in refused.err, refused.err
    assert Job.objects.count() == 0
    path.write_text(path.read_text().replace("gpus: -2", "gpus: 0"))
    done = run_cli("submit", str(path), url=live_server.url, token=key)
    assert done.code == 0, done.err
    ids = sorted(Job.objects.values_list("pk", flat=True))
    assert done.out.startswith(f"Submitted 3 jobs: {ids[0]}..{ids[-1]}")
    again = run_cli("submit", str(path), url=live_server.url, token=key)
    assert again.code == 0 and "already submitted" in again.out and Job.objects.count() == 3
