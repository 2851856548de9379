"""Job control (docs/job-control.md) through the API and the portal's scheduling cycle:
dependencies, arrays, hold / release, edits of a pending job, a person's pause, requeue."""

from __future__ import annotations

import time

import pytest

from portal.core.jobcontrol import HELD_REASON, expand_path, parse_array, parse_dependencies
from portal.core.models import Gpu, Job, Node, Placement, PlacementPart, PolicySettings
from portal.core.scheduling import run_cycle
from portal.core.services import job_submit, job_transition
from portal.core.states import JobState

pytestmark = pytest.mark.django_db
URL = "/api/v1/jobs/"


@pytest.fixture
def cpu_node():
    PolicySettings.objects.create(name="f", policy="fifo", params={}, active=True)
    return Node.objects.create(name="jc-cpu", kind="cpu", cores=32, memory_mb=65536)


def _post(api, **body):
    body.setdefault("command", "true")
    body.setdefault("name", "j")
    return api.post(URL, body, format="json")


def _state(job_id: int) -> Job:
    return Job.objects.get(pk=job_id)


# -- parsing -------------------------------------------------------------------------------------


def test_dependencies_and_arrays_are_read_in_slurms_forms():
    assert parse_dependencies("afterok:8:9,after:7,12") == [
        {"type": "afterok", "job": 8},
        {"type": "afterok", "job": 9},
        {"type": "after", "job": 7},
        {"type": "afterany", "job": 12},
    ]
    assert parse_dependencies([{"type": "afternotok", "job": 3}]) == [
        {"type": "afternotok", "job": 3}
    ]
    for bad in ("afterwards:3", "afterok:x", [True], "afterok:0", [{"type": "after", "job": 1.5}]):
        with pytest.raises(ValueError):
            parse_dependencies(bad)
    spec = parse_array("0-99%8")
    assert spec.indices == tuple(range(100)) and spec.limit == 8
    assert parse_array("1,3,5-7").indices == (1, 3, 5, 6, 7)
    assert parse_array("0-15:4").indices == (0, 4, 8, 12)
    for bad in ("", "5-1", "0-9%0", "a-b", "0-20000"):
        with pytest.raises(ValueError):
            parse_array(bad)
    assert expand_path("out/%u-%j_%a.%%", job_id=9, user="ann", array_index=4) == "out/ann-9_4.%"
    assert expand_path("o-%j-%a", job_id=9, user="ann", array_index=None) == "o-9-0"


# -- dependencies -------------------------------------------------------------------------------


def test_a_dependent_job_waits_with_a_reason_and_starts_once_its_dependency_completed(
    alice_api, cpu_node
):
    first = _post(alice_api).json()["id"]
    response = _post(alice_api, dependencies=f"afterok:{first}")
    assert response.status_code == 201, response.content
    second = response.json()["id"]
    assert response.json()["dependencies"] == [{"type": "afterok", "job": first}]
    run_cycle()
    assert _state(first).state == "SCHEDULED"
    waiting = _state(second)
    assert waiting.state == "PENDING"
    assert waiting.waiting_reason == f"waiting for job {first} to complete (afterok)"
    assert (
        alice_api.get(f"{URL}{second}/")
        .json()["waiting_reason"]
        .startswith(f"waiting for job {first} to complete")
    )
    job_transition(_state(first), JobState.RUNNING, actor="t")
    run_cycle()
    assert _state(second).state == "PENDING"  # running is not completed
    job_transition(_state(first), JobState.COMPLETED, actor="t", exit_code=0)
    run_cycle()
    assert _state(second).state == "SCHEDULED"


def test_a_dependency_that_can_never_be_met_cancels_the_job_with_the_reason(alice_api, cpu_node):
    first = _post(alice_api).json()["id"]
    ok = _post(alice_api, dependencies=f"afterok:{first}").json()["id"]
    notok = _post(alice_api, dependencies=[{"type": "afternotok", "job": first}]).json()["id"]
    run_cycle()
    job_transition(_state(first), JobState.RUNNING, actor="t")
    job_transition(_state(first), JobState.FAILED, actor="t", exit_code=3)
    run_cycle()
    cancelled = _state(ok)
    assert cancelled.state == "CANCELLED"
    assert cancelled.failure_reason == (
        f"dependency never satisfied: job {first} ended FAILED, not COMPLETED (afterok)"
    )
    assert _state(notok).state == "SCHEDULED"


def test_dependencies_only_on_your_own_jobs_and_bad_forms_are_400s(alice_api, bob_api, cpu_node):
    bobs = _post(bob_api).json()["id"]
    response = _post(alice_api, dependencies=f"afterok:{bobs}")
    assert response.status_code == 400
    assert "only on your own jobs" in response.json()["dependencies"][0]
    response = _post(alice_api, dependencies="afterwhile:3")
    assert response.status_code == 400 and "unknown dependency type" in str(response.json())
    assert Job.objects.filter(owner__username="alice").count() == 0


def test_an_edit_that_would_make_jobs_wait_for_each_other_is_refused(alice_api, cpu_node):
    a = _post(alice_api, held=True).json()["id"]
    b = _post(alice_api, dependencies=f"afterok:{a}").json()["id"]
    c = _post(alice_api, dependencies=f"afterany:{b}").json()["id"]
    response = alice_api.patch(f"{URL}{a}/", {"dependencies": f"after:{c}"}, format="json")
    assert response.status_code == 400
    assert response.json()["dependencies"] == [
        f"a cycle: job {a} waits for job {c} waits for job {b} waits for job {a}"
    ]
    assert _state(a).dependencies == []


# -- hold / release -----------------------------------------------------------------------------


def test_a_held_job_does_not_start_until_released(alice_api, cpu_node):
    held = _post(alice_api, held=True).json()
    assert held["held"] is True
    run_cycle()
    assert _state(held["id"]).state == "PENDING"
    assert _state(held["id"]).waiting_reason == HELD_REASON
    response = alice_api.post(f"{URL}{held['id']}/release/")
    assert response.status_code == 200 and response.json()["held"] is False
    run_cycle()
    assert _state(held["id"]).state == "SCHEDULED"
    # hold works on a pending job only; release only on a held one
    assert alice_api.post(f"{URL}{held['id']}/hold/").status_code == 409
    assert alice_api.post(f"{URL}{held['id']}/release/").status_code == 409
    other = _post(alice_api).json()["id"]
    assert alice_api.post(f"{URL}{other}/hold/").json()["held"] is True
    run_cycle()
    assert _state(other).state == "PENDING"


def test_another_users_job_cannot_be_held_released_requeued_or_edited(alice_api, bob_api, cpu_node):
    job = _post(alice_api).json()["id"]
    for verb in ("hold", "release", "requeue"):
        assert bob_api.post(f"{URL}{job}/{verb}/").status_code == 404
    assert bob_api.patch(f"{URL}{job}/", {"cpus": 2}, format="json").status_code == 404


# -- arrays -------------------------------------------------------------------------------------


def test_a_1000_task_array_is_one_request_under_two_seconds(alice_api, cpu_node):
    started = time.perf_counter()
    response = _post(alice_api, name="sweep", array="0-999%8")
    elapsed = time.perf_counter() - started
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["array_job_id"] == body["id"] and body["array_index"] == 0
    assert body["array_limit"] == 8
    tasks = Job.objects.filter(array_of_id=body["id"])
    assert tasks.count() == 1000
    assert sorted(tasks.values_list("array_index", flat=True)) == list(range(1000))
    print(f"1,000-task array submitted in {elapsed:.3f} s")
    assert elapsed < 2.0, elapsed
    listed = alice_api.get(URL, {"array": body["id"], "page_size": 5}).json()
    assert listed["count"] == 1000
    assert [j["array_index"] for j in listed["results"]] == [0, 1, 2, 3, 4]


def test_an_array_never_has_more_tasks_placed_than_its_limit(alice_api, cpu_node):
    body = _post(alice_api, name="sweep", array="0-9%3").json()
    run_cycle()
    tasks = Job.objects.filter(array_of_id=body["id"]).order_by("array_index")
    assert [t.array_index for t in tasks if t.state == "SCHEDULED"] == [0, 1, 2]
    waiting = tasks.filter(state="PENDING").first()
    assert waiting.waiting_reason == f"array {body['id']} runs at most 3 tasks at once"
    run_cycle()
    assert tasks.filter(state="SCHEDULED").count() == 3
    done = tasks.get(array_index=1)
    job_transition(done, JobState.RUNNING, actor="t")
    job_transition(done, JobState.COMPLETED, actor="t", exit_code=0)
    run_cycle()
    assert [t.array_index for t in tasks.filter(state="SCHEDULED")] == [0, 2, 3]


def test_array_task_environment_names_its_index(alice, cpu_node):
    from portal.core.agent_sync import _job_control_env

    job, _ = job_submit(alice, name="a", command="true", array=parse_array("4-6"))
    task = Job.objects.get(array_of=job, array_index=5)
    assert _job_control_env(task) == {
        "COSCHED_ARRAY_JOB_ID": str(job.pk),
        "COSCHED_ARRAY_TASK_ID": "5",
    }
    Job.objects.filter(pk=task.pk).update(output_path="logs/%u-%j-%a.out")
    task.refresh_from_db()
    assert _job_control_env(task)["COSCHED_OUTPUT"] == f"logs/alice-{task.pk}-5.out"


def test_bad_arrays_are_400s_naming_the_field(alice_api, cpu_node):
    for bad in ("0-20000", "9-1", "0-3%0", 7):
        response = _post(alice_api, array=bad)
        assert response.status_code == 400 and "array" in response.json(), bad


# -- edit ---------------------------------------------------------------------------------------


def test_a_pending_job_can_be_edited_and_a_placed_one_cannot(alice_api, cpu_node):
    first = _post(alice_api).json()["id"]
    job = _post(alice_api, cpus=2, held=True).json()["id"]
    response = alice_api.patch(
        f"{URL}{job}/",
        {"cpus": 4, "priority": 5, "time_limit": "30m", "dependencies": f"afterany:{first}"},
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["cpus"], body["priority"], body["time_limit"]) == (4, 5, 1800)
    assert body["dependencies"] == [{"type": "afterany", "job": first}]
    events = alice_api.get(f"{URL}{job}/").json()["events"]
    assert "cpus 2 -> 4" in events[-1]["message"]
    # bad values and rules: 400 naming the field, nothing changed
    for change, field in (
        ({"cpus": 0}, "cpus"),
        ({"cpus": 999}, "cpus"),  # more than any node has (admission)
        ({"time_limit": "soon"}, "time_limit"),
        ({"dependencies": f"afterok:{job}"}, "dependencies"),
        ({"command": "rm -rf /"}, "command"),
    ):
        response = alice_api.patch(f"{URL}{job}/", change, format="json")
        assert response.status_code == 400 and field in response.json(), (change, response.json())
    assert _state(job).cpus == 4
    run_cycle()
    assert _state(first).state == "SCHEDULED"
    response = alice_api.patch(f"{URL}{first}/", {"cpus": 2}, format="json")
    assert response.status_code == 409 and response.json()["state"] == "SCHEDULED"


# -- a person's pause and requeue ---------------------------------------------------------------


def _running_on_gpu(owner) -> Job:
    node = Node.objects.create(name="jc-gpu", kind="gpu", cores=8, memory_mb=65536)
    gpu = Gpu.objects.create(node=node, index=0, model="V100", memory_mb=16384, uuid="GPU-jc-0")
    job = Job.objects.create(
        owner=owner, name="r", command="sleep 9", gpus=1, gpu_memory_mb=1000, state="SCHEDULED"
    )
    placement = Placement.objects.create(job=job, node=node, gpu_memory_mb=1000, policy="t")
    placement.gpus.set([gpu])
    PlacementPart.objects.create(placement=placement, node=node, gpu_indices=[0])
    job_transition(job, JobState.RUNNING, actor="t")
    return job


@pytest.mark.parametrize("by", ["person", "policy"])
def test_a_persons_pause_lasts_until_they_resume_while_a_policy_pause_is_undone(
    alice_api, alice, by
):
    PolicySettings.objects.create(
        name="plan", policy="placement_rate+exec_plan", params={}, active=True
    )
    job = _running_on_gpu(alice)
    if by == "person":
        response = alice_api.post(f"{URL}{job.pk}/pause/")
        assert response.status_code == 200 and response.json()["user_paused"] is True
    else:
        job_transition(job, JobState.PAUSED, actor="scheduler", message="exec_plan: step")
    for _ in range(3):
        run_cycle()
    job.refresh_from_db()
    if by == "policy":  # the memory plan resumes a job alone on its GPU
        assert job.state == "RUNNING"
        return
    assert job.state == "PAUSED" and job.user_paused
    response = alice_api.post(f"{URL}{job.pk}/resume/")
    assert response.status_code == 200 and response.json()["user_paused"] is False
    run_cycle()
    assert _state(job.pk).state == "RUNNING"


def test_the_owner_requeues_a_running_job(alice_api, alice):
    job = _running_on_gpu(alice)
    response = alice_api.post(f"{URL}{job.pk}/requeue/")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "PENDING"
    attempt = Placement.objects.get(job=job)
    assert not attempt.active and attempt.outcome == "requeued"
    assert "requeued by user:alice" in attempt.end_reason
    assert alice_api.post(f"{URL}{job.pk}/requeue/").status_code == 409


def test_the_schema_documents_job_control(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    paths = schema["paths"]
    assert "patch" in paths["/api/v1/jobs/{id}/"] and "put" not in paths["/api/v1/jobs/{id}/"]
    for verb in ("hold", "release", "requeue"):
        assert "post" in paths[f"/api/v1/jobs/{{id}}/{verb}/"]
    assert "text/plain" in str(paths["/api/v1/jobs/{id}/log/full/"]["get"]["responses"]["200"])
    job = schema["components"]["schemas"]["Job"]["properties"]
    for name in ("dependencies", "held", "array", "array_job_id", "user_paused", "output"):
        assert name in job, name
    update = schema["components"]["schemas"]["PatchedJobUpdate"]["properties"]
    assert set(update) == {
        "gpus", "gpu_memory_mb", "cpus", "memory_mb", "time_limit", "priority", "dependencies",
    }  # fmt: skip


def test_the_forms_refuse_bad_job_control_fields_naming_them(client, alice, cpu_node):
    client.force_login(alice)
    response = client.post(
        "/jobs/new/",
        {"name": "x", "command": "true", "cpus": 1, "array": "9-1", "dependencies": "soon:3",
         "output": "../escape.out"},
    )  # fmt: skip
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert {"array", "dependencies", "output"} <= set(errors), errors
    assert not Job.objects.exists()
    running = _running_on_gpu(alice)
    page = client.get(f"/jobs/{running.pk}/edit/", follow=True)
    assert "only a pending job of yours can be changed" in page.content.decode()
    pending = _post_as(alice, cpus=2)
    response = client.post(
        f"/jobs/{pending.pk}/edit/",
        {"gpus": 0, "cpus": 99999, "priority": 0, "time_limit": "", "dependencies": ""},
    )
    assert response.status_code == 400 and "cpus" in response.context["form"].errors
    assert client.post(f"/jobs/{pending.pk}/explode/").status_code == 404


def _post_as(owner, **fields) -> Job:
    job, _ = job_submit(owner, name="p", command="true", **fields)
    return job
