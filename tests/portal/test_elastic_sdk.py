"""Elastic windows over HTTP: the training SDK's ``report_window`` against a real portal
(pytest-django's live server) with the attempt's job token."""

from __future__ import annotations

import pytest
from django.utils import timezone

from portal.core.models import ElasticChange, Gpu, Job, Node, Placement, PlacementPart
from portal.core.training import job_token
from workers.sdk import TrainingClient

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def job(alice) -> Job:
    node = Node.objects.create(name="n", kind="gpu", cores=8, memory_mb=32768)
    for i in range(4):
        Gpu.objects.create(node=node, index=i, model="V100", memory_mb=16384)
    job = Job.objects.create(
        owner=alice,
        name="elastic",
        gpus=2,
        state="RUNNING",
        started_at=timezone.now(),
        elastic_min_workers=1,
        elastic_max_workers=4,
    )
    p = Placement.objects.create(job=job, attempt=1, node=node, policy="test")
    p.gpus.set(list(node.gpus.filter(index__lt=2)))
    PlacementPart.objects.create(placement=p, node=node, gpu_indices=[0, 1], cpus=1)
    return job


def test_windows_reach_the_engine_and_the_answer_comes_back(live_server, job):
    env = {"COSCHED_API_URL": live_server.url, "COSCHED_JOB_TOKEN": job_token(job.pk, 1)}
    client = TrainingClient(environ=env)
    for _ in range(3):
        reply = client.report_window(2, 10, 0.5, [1.0, 1.0], 1000.0)
    assert reply is not None and reply["workers"] == 2 and reply["replace_ranks"] == []
    job.refresh_from_db()
    assert job.elastic_state["measured"][0][:2] == [2, pytest.approx(20.0)]
    # a proposal is answered at the next window; a checkpointed window is a safe point: the
    # portal regroups the job into attempt 2 with 3 GPUs, and attempt 1's token is spent
    ElasticChange.objects.create(
        job=job, kind="scale", workers_from=2, workers_to=3, reason="probe 3 workers"
    )
    state = dict(job.elastic_state, in_transition=True)
    Job.objects.filter(pk=job.pk).update(elastic_state=state)
    reply = client.report_window(2, 10, 0.5, [1.0, 1.0], 990.0)
    assert reply["workers"] == 3 and reply["regroup"] is False
    assert client.workers == 3
    reply = client.report_window(2, 10, 0.5, [1.0, 1.0], 980.0, checkpointed=True)
    assert reply["regroup"] is True and reply["attempt"] == 2
    change = ElasticChange.objects.get(job=job)
    assert change.applied and change.attempt == 2 and change.gpus == "n/0, n/1, n/2"
    old, new = Placement.objects.filter(job=job).order_by("attempt")
    assert (old.active, old.outcome, new.active) == (False, "regrouped", True)
    assert new.gpus.count() == 3 and new.parts.get().gpu_indices == [0, 1, 2]
    assert client.report_window(2, 10, 0.5, [1.0, 1.0], 970.0) is None
    assert client.last_error.startswith("403")
    env["COSCHED_JOB_TOKEN"] = job_token(job.pk, 2)
    nxt = TrainingClient(environ=env)
    assert nxt.report_window(3, 10, 0.4, [1.0] * 3, 960.0)["workers"] == 3
    job.refresh_from_db()
    assert job.elastic_state["workers"] == 3 and not job.elastic_state["in_transition"]


def test_a_window_in_a_changed_local_batch_is_counted_in_reference_mini_batches(live_server, job):
    # a maximum global batch of 1,024 and no profiled batch size: the reference is 1,024, so
    # 10 mini-batches of 512 samples in 0.5 s are 10 reference mini-batches per second
    Job.objects.filter(pk=job.pk).update(max_global_batch=1024)
    env = {"COSCHED_API_URL": live_server.url, "COSCHED_JOB_TOKEN": job_token(job.pk, 1)}
    client = TrainingClient(environ=env)
    for _ in range(3):
        reply = client.report_window(2, 10, 0.5, [1.0, 1.0], 1000.0, local_batch=512)
    assert reply is not None and reply["local_batch"] == 512  # 1,024 over 2 workers
    job.refresh_from_db()
    assert job.elastic_state["measured"][0][:2] == [2, pytest.approx(10.0)]
    assert job.elastic_state["remaining_steps"] == pytest.approx(500.0)


def test_bad_windows_and_bad_tokens_are_refused(live_server, job):
    import json
    import urllib.error
    import urllib.request

    def post(body, token):
        request = urllib.request.Request(
            live_server.url + "/api/v1/training/elastic/",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    token = job_token(job.pk, 1)
    code, body = post({"workers": 0, "batches": 10, "seconds": -1, "speed": 3}, token)
    assert code == 400 and {"speed", "workers", "seconds"} <= set(body["errors"])
    code, body = post({"workers": 2, "batches": 10, "seconds": 1.0, "checkpointed": 1}, token)
    assert code == 400 and body["errors"] == {"checkpointed": ["must be true or false"]}
    code, body = post({"workers": 2, "batches": 10, "seconds": 1.0, "local_batch": 0}, token)
    assert code == 400
    assert body["errors"] == {
        "local_batch": ["must be a whole number of samples between 1 and 10^7"]
    }
    code, body = post({"workers": 0, "batches": 10, "seconds": -1}, token)
    assert code == 400 and {"workers", "seconds"} <= set(body["errors"])
    code, body = post({"workers": 2, "batches": 10}, token)
    assert code == 400 and body["errors"]["seconds"] == ["required"]
    code, _ = post({"workers": 2, "batches": 10, "seconds": 1.0}, "cjt_forged")
    assert code == 401
    assert not ElasticChange.objects.exists()
    job.refresh_from_db()
    assert job.elastic_state == {}


def test_an_attempt_that_reports_too_often_is_told_to_slow_down(live_server, job, settings):
    from django.core.cache import cache

    cache.clear()
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {
            **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"],
            "job": "3/min",
        },
    }
    env = {"COSCHED_API_URL": live_server.url, "COSCHED_JOB_TOKEN": job_token(job.pk, 1)}
    client = TrainingClient(environ=env)
    for _ in range(3):
        assert client.report_window(2, 10, 0.5, [1.0, 1.0], 1000.0) is not None
    assert client.report_window(2, 10, 0.5, [1.0, 1.0], 990.0) is None
    assert client.last_error.startswith("429") and "retry in" in client.last_error
    assert client.enabled  # only slowed down, not cut off
    job.refresh_from_db()
    assert job.elastic_state["measured"][0][2] == 2  # the refused window was not counted
