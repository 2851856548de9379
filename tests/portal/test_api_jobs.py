"""REST API jobs: submit, list, retrieve, cancel; every bad-input path is a 400 naming the
field, and nothing is stored."""

from __future__ import annotations

import pytest

from portal.core import services
from portal.core.models import ApplicationProfile, Job, JobEvent
from portal.core.states import JobState

pytestmark = pytest.mark.django_db

URL = "/api/v1/jobs/"
GOOD = {
    "name": "resnet-nightly",
    "command": "python train.py",
    "gpus": 1,
    "gpu_memory_mb": 8000,
    "cpus": 4,
    "memory_mb": 16000,
    "kind": "dl-train",
    "params": {"batch_size": 64},
    "priority": 5,
}


@pytest.fixture
def approved_profile(staff):
    return ApplicationProfile.objects.create(
        name="CNN-MNIST", kind="dl-train", status="approved", approved_by=staff
    )


def test_submit_returns_the_contract_fields(alice_api, alice):
    response = alice_api.post(URL, GOOD, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    for field, value in GOOD.items():
        assert body[field] == value
    assert body["state"] == "PENDING"
    assert body["owner"] == "alice"
    assert body["placement"] is None
    assert body["submitted_at"]
    job = Job.objects.get(pk=body["id"])
    assert job.owner == alice
    assert response["Location"] == f"/api/v1/jobs/{job.pk}/"
    assert list(job.events.values_list("to_state", flat=True)) == ["PENDING"]


def test_minimal_job_gets_defaults(alice_api):
    response = alice_api.post(URL, {"name": "hello", "command": "echo hi"}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert (body["gpus"], body["cpus"], body["kind"], body["priority"]) == (0, 1, "other", 0)
    assert body["params"] == {}


def test_job_with_approved_profile_takes_its_kind(alice_api, approved_profile):
    payload = {"name": "mnist", "command": "python -m workers.emulate --profile CNN-MNIST"}
    response = alice_api.post(URL, {**payload, "profile": approved_profile.pk}, format="json")
    assert response.status_code == 201
    assert response.json()["profile"] == approved_profile.pk
    assert response.json()["kind"] == "dl-train"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpus", -1),
        ("gpus", "two"),
        ("gpus", 1.5),
        ("cpus", 0),
        ("gpu_memory_mb", -5),
        ("memory_mb", "lots"),
        ("kind", "training"),
        ("params", "batch=64"),
        ("params", [1, 2]),
        ("priority", "high"),
        ("name", ""),
        ("name", "x" * 201),
        ("profile", 999999),
        ("profile", "abc"),
        ("elastic_min_workers", 0),
    ],
)
def test_each_bad_field_is_a_400_naming_it(alice_api, field, value):
    response = alice_api.post(URL, {**GOOD, field: value}, format="json")
    assert response.status_code == 400
    assert field in response.json(), response.json()
    assert Job.objects.count() == 0


def test_missing_name_is_a_400(alice_api):
    payload = {k: v for k, v in GOOD.items() if k != "name"}
    response = alice_api.post(URL, payload, format="json")
    assert response.status_code == 400
    assert "name" in response.json()


def test_missing_command_and_image_is_a_400(alice_api):
    response = alice_api.post(URL, {**GOOD, "command": "  "}, format="json")
    assert response.status_code == 400
    assert "command" in response.json()
    assert Job.objects.count() == 0


def test_container_image_alone_is_enough(alice_api):
    payload = {**GOOD, "command": "", "container_image": "pytorch/pytorch:2.3"}
    assert alice_api.post(URL, payload, format="json").status_code == 201


def test_gpu_memory_on_a_cpu_job_is_a_400(alice_api):
    response = alice_api.post(URL, {**GOOD, "gpus": 0, "gpu_memory_mb": 1000}, format="json")
    assert response.status_code == 400
    assert "gpu_memory_mb" in response.json()


def test_elastic_min_above_max_is_a_400(alice_api):
    payload = {**GOOD, "elastic_min_workers": 4, "elastic_max_workers": 2}
    response = alice_api.post(URL, payload, format="json")
    assert response.status_code == 400
    assert "elastic_max_workers" in response.json()


def test_several_bad_fields_are_all_named(alice_api):
    payload = {**GOOD, "gpus": -1, "cpus": "many", "kind": "nope", "command": ""}
    response = alice_api.post(URL, payload, format="json")
    assert response.status_code == 400
    assert {"gpus", "cpus", "kind", "command"} <= set(response.json())
    assert Job.objects.count() == 0


def test_type_errors_and_rule_errors_come_back_together(alice_api, staff):
    draft = ApplicationProfile.objects.create(name="draft-app", status="draft")
    payload = {
        **GOOD,
        "gpus": "x",
        "profile": draft.pk,
        "elastic_min_workers": 3,
        "elastic_max_workers": 1,
    }
    response = alice_api.post(URL, payload, format="json")
    assert response.status_code == 400
    assert {"gpus", "profile", "elastic_max_workers"} <= set(response.json())


def test_unknown_fields_are_rejected_by_name(alice_api):
    response = alice_api.post(URL, {**GOOD, "gpu": 2, "comand": "x"}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert set(body) == {"gpu", "comand"}
    assert "unknown field" in body["gpu"][0]
    assert Job.objects.count() == 0


def test_read_only_fields_in_a_request_are_rejected(alice_api):
    response = alice_api.post(URL, {**GOOD, "state": "RUNNING", "owner": "bob"}, format="json")
    assert response.status_code == 400
    assert {"state", "owner"} <= set(response.json())


@pytest.mark.parametrize("status_", ["draft", "retired"])
def test_unapproved_profile_is_a_400(alice_api, status_):
    profile = ApplicationProfile.objects.create(name="p", status=status_)
    response = alice_api.post(URL, {**GOOD, "profile": profile.pk}, format="json")
    assert response.status_code == 400
    assert status_ in response.json()["profile"][0]
    assert Job.objects.count() == 0
    assert JobEvent.objects.count() == 0


def test_a_body_that_is_not_an_object_is_a_400(alice_api):
    response = alice_api.post(URL, [GOOD], format="json")
    assert response.status_code == 400
    assert Job.objects.count() == 0


def test_malformed_json_is_a_400(alice_api):
    response = alice_api.post(URL, "{not json", content_type="application/json")
    assert response.status_code == 400


def test_anonymous_requests_are_refused(client):
    assert client.get(URL).status_code in (401, 403)
    assert client.post(URL, GOOD, content_type="application/json").status_code in (401, 403)


def _submit(user, **extra):
    data = {"name": "job", "command": "true", **extra}
    return services.job_submit(user, **data)[0]


def test_list_filters_by_state_kind_and_name(alice_api, alice):
    a = _submit(alice, name="train-a", kind="dl-train")
    b = _submit(alice, name="infer-b", kind="dl-infer")
    c = _submit(alice, name="train-c", kind="hpc")
    services.job_cancel(c, actor="test")

    def names(query):
        response = alice_api.get(URL + query)
        assert response.status_code == 200, response.json()
        return {j["name"] for j in response.json()["results"]}

    assert names("") == {"train-a", "infer-b", "train-c"}
    assert names("?state=PENDING") == {"train-a", "infer-b"}
    assert names("?state=cancelled") == {"train-c"}
    assert names("?state=PENDING,CANCELLED") == {"train-a", "infer-b", "train-c"}
    assert names("?kind=dl-infer") == {"infer-b"}
    assert names("?search=train") == {"train-a", "train-c"}
    assert names("?search=TRAIN&state=PENDING") == {"train-a"}
    assert a.pk and b.pk


def test_list_with_a_bad_filter_is_a_400(alice_api):
    response = alice_api.get(URL + "?state=DONE")
    assert response.status_code == 400
    assert "state" in response.json()
    assert "kind" in alice_api.get(URL + "?kind=gpu").json()


def test_list_is_paginated_newest_first(alice_api, alice):
    for i in range(7):
        _submit(alice, name=f"job-{i}")
    page1 = alice_api.get(URL + "?page_size=3").json()
    assert page1["count"] == 7
    assert [j["name"] for j in page1["results"]] == ["job-6", "job-5", "job-4"]
    assert page1["next"] and page1["previous"] is None
    page3 = alice_api.get(URL + "?page_size=3&page=3").json()
    assert [j["name"] for j in page3["results"]] == ["job-0"]
    assert alice_api.get(URL + "?page=99").status_code == 404


def test_retrieve_shows_the_timeline(alice_api, alice):
    job = _submit(alice)
    services.job_transition(job, "SCHEDULED", actor="scheduler", message="placed")
    body = alice_api.get(f"{URL}{job.pk}/").json()
    assert body["state"] == "SCHEDULED"
    assert [(e["from_state"], e["to_state"]) for e in body["events"]] == [
        ("", "PENDING"),
        ("PENDING", "SCHEDULED"),
    ]
    assert body["events"][1]["actor"] == "scheduler"


def test_retrieve_shows_the_active_placement(alice_api, alice):
    from portal.core.models import Gpu, Node, Placement

    node = Node.objects.create(name="gpu-1", kind="gpu", cores=16)
    gpu = Gpu.objects.create(node=node, index=1, model="A30", memory_mb=24576)
    job = _submit(alice, gpus=1)
    placement = Placement.objects.create(
        job=job,
        node=node,
        sharing_mode="mig",
        mig_profile="2g.12gb",
        policy="sharing_mode",
        explanation="small, high sensitivity: MIG 2g.12gb",
    )
    placement.gpus.add(gpu)
    body = alice_api.get(f"{URL}{job.pk}/").json()
    placed_at = body["placement"].pop("placed_at")
    assert placed_at.startswith(placement.created_at.strftime("%Y-%m-%dT%H:%M"))
    assert body["placement"] == {
        "node": "gpu-1",
        "gpus": [1],
        "sharing_mode": "mig",
        "mps_percentage": None,
        "mig_profile": "2g.12gb",
        "policy": "sharing_mode",
        "explanation": "small, high sensitivity: MIG 2g.12gb",
        "active": True,
        "released_at": None,
    }
    listed = alice_api.get(URL).json()["results"][0]
    assert listed["placement"]["node"] == "gpu-1"


def test_a_finished_job_shows_where_it_ran_last(alice_api, alice):
    from portal.core.models import Gpu, Node, Placement

    node = Node.objects.create(name="gpu-1", kind="gpu", cores=16)
    gpu = Gpu.objects.create(node=node, index=0, model="V100", memory_mb=16384)
    job = _submit(alice, gpus=1)
    first = Placement.objects.create(job=job, node=node, policy="fifo", explanation="first")
    first.gpus.add(gpu)
    services.job_transition(job, "SCHEDULED", actor="scheduler")
    services.job_transition(job, "PENDING", actor="scheduler", message="node lost")
    second = Placement.objects.create(job=job, node=node, policy="fifo", explanation="second")
    second.gpus.add(gpu)
    services.job_transition(job, "SCHEDULED", actor="scheduler")
    services.job_transition(job, "RUNNING", actor="node:gpu-1")
    services.job_transition(job, "COMPLETED", actor="node:gpu-1", exit_code=0)
    for body in (alice_api.get(f"{URL}{job.pk}/").json(), alice_api.get(URL).json()["results"][0]):
        assert body["state"] == "COMPLETED"
        assert body["placement"]["explanation"] == "second"
        assert body["placement"]["active"] is False
        assert body["placement"]["released_at"] is not None
        assert body["placement"]["gpus"] == [0]
        assert body["waiting_reason"] is None
    detail = alice_api.get(f"{URL}{job.pk}/").json()
    assert [p["explanation"] for p in detail["placements"]] == ["second", "first"]
    assert not any(p["active"] for p in detail["placements"])


def test_cancel_a_pending_job(alice_api, alice):
    job = _submit(alice)
    response = alice_api.post(f"{URL}{job.pk}/cancel/")
    assert response.status_code == 200
    assert response.json()["state"] == "CANCELLED"
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and job.finished_at is not None
    assert job.events.last().actor == "user:alice"


@pytest.mark.parametrize("final", ["COMPLETED", "FAILED", "CANCELLED"])
def test_cancel_a_finished_job_is_a_409(alice_api, alice, final):
    job = _submit(alice)
    if final == "CANCELLED":
        services.job_cancel(job, actor="test")
    else:
        services.job_transition(job, "SCHEDULED", actor="test")
        services.job_transition(job, "RUNNING", actor="test")
        services.job_transition(job, final, actor="test")
    response = alice_api.post(f"{URL}{job.pk}/cancel/")
    assert response.status_code == 409
    assert response.json()["state"] == final
    assert f"already {final}" in response.json()["detail"]
    job.refresh_from_db()
    assert job.state == final


def test_jobs_are_not_replaced_or_deleted_and_patch_changes_only_editable_fields(alice_api, alice):
    job = _submit(alice)
    assert alice_api.put(f"{URL}{job.pk}/", GOOD, format="json").status_code == 405
    response = alice_api.patch(f"{URL}{job.pk}/", {"name": "x"}, format="json")
    assert response.status_code == 400 and "unknown field" in response.json()["name"][0]
    assert alice_api.delete(f"{URL}{job.pk}/").status_code == 405


def _cluster() -> None:
    from portal.core.models import Gpu, Node

    node = Node.objects.create(name="gpu-1", kind="gpu", cores=16, memory_mb=65536)
    for i in range(2):
        Gpu.objects.create(node=node, index=i, model="A30", memory_mb=24576)


def test_the_answer_to_a_submission_is_the_job_as_stored(alice_api, alice, approved_profile):
    """The 201 is built from the saved job, not read back (issue 27): it must say what a GET
    of the job says."""
    _cluster()
    first = services.job_submit(alice, name="first", command="true")[0]
    payload = {
        **GOOD,
        "profile": approved_profile.pk,
        "time_limit": "2h",
        "dependencies": f"afterok:{first.pk}",
        "params": {"lr": 0.001, "layers": [1, 2, {"deep": None}], "name": "x"},
        "elastic_min_workers": 1,
        "elastic_max_workers": 2,
        "elastic_value_per_hour": 1.5,
        "sharing": "allowed",
        "output": "out-%j.txt",
        "held": True,
    }
    created = alice_api.post(URL, payload, format="json")
    assert created.status_code == 201, created.json()
    stored = alice_api.get(f"{URL}{created.json()['id']}/").json()
    answer = created.json()
    assert answer.pop("queue_wait_s") >= 0
    assert {k: stored[k] for k in answer if k != "queue_wait_s"} == answer
    assert answer["profile_name"] == "CNN-MNIST" and answer["project"] == "alice"

    array = alice_api.post(URL, {"name": "a", "command": "true", "array": "0-3%2"}, format="json")
    assert array.status_code == 201, array.json()
    answer = array.json()
    answer.pop("queue_wait_s")
    stored = alice_api.get(f"{URL}{answer['id']}/").json()
    assert {k: stored[k] for k in answer} == answer
    assert (answer["array_job_id"], answer["array_index"], answer["array_limit"]) == (
        answer["id"],
        0,
        2,
    )


def test_a_submission_reads_the_cluster_and_the_project_once(alice_api):
    """The serializer's checks and job_submit's share one read of the registered cluster and
    of the project, and the answer reads nothing back (issue 27)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    _cluster()
    alice_api.post(URL, {"name": "warm", "command": "true"}, format="json")  # personal project
    with CaptureQueriesContext(connection) as queries:
        response = alice_api.post(URL, {**GOOD, "gpu_memory_mb": 8000}, format="json")
    assert response.status_code == 201, response.json()
    selects = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]

    def reading(table: str) -> int:
        return sum(f'FROM "{table}"' in sql for sql in selects)

    # The cluster in one query (nodes joined with their GPUs), the project in one.
    cluster_reads = [sql for sql in selects if '"core_node"' in sql or '"core_gpu"' in sql]
    assert len(cluster_reads) == 1 and 'JOIN "core_gpu"' in cluster_reads[0], cluster_reads
    assert len([sql for sql in selects if '"teams_' in sql]) == 1
    assert reading("core_job") == 0 and reading("core_placement") == 0
