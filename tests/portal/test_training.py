"""The training SDK's endpoint: job tokens, reports, the DR manager run at epoch ends, and the
ratio history (portal.core.training)."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.utils import timezone

from portal.core import scheduling
from portal.core.models import (
    ApplicationProfile,
    DataRatioChange,
    Gpu,
    Job,
    MetricSample,
    Node,
    Placement,
    PlacementPart,
    PolicySettings,
    ProfileGpuTime,
    TrainingState,
)
from portal.core.training import job_token, job_token_placement, ratio_history, training_env

pytestmark = pytest.mark.django_db

URL = "/api/v1/training/report/"


@pytest.fixture
def node(db) -> Node:
    node = Node.objects.create(name="quadro", kind="gpu", cores=16, memory_mb=65536)
    for i in range(2):
        Gpu.objects.create(node=node, index=i, model="V100", memory_mb=16384)
    return node


def _running(owner, node: Node, gpu: int, *, solo_s: float | None = 600.0, name="j") -> Job:
    profile = None
    if solo_s is not None:
        profile = ApplicationProfile.objects.create(name=f"p-{name}", kind="dl-train")
        ProfileGpuTime.objects.create(profile=profile, gpu_model="V100", time_s=solo_s)
    job = Job.objects.create(
        owner=owner,
        name=name,
        command="train",
        gpus=1,
        state="RUNNING",
        profile=profile,
        started_at=timezone.now(),
    )
    placement = Placement.objects.create(job=job, attempt=1, node=node, policy="test")
    PlacementPart.objects.create(placement=placement, node=node, gpu_indices=[gpu], cpus=1)
    placement.gpus.add(Gpu.objects.get(node=node, index=gpu))
    return job


def _post(token: str | None, body, client: Client | None = None):
    headers = {} if token is None else {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    return (client or Client()).post(
        URL, data=json.dumps(body), content_type="application/json", **headers
    )


def _use_slowdown_dr(**params) -> None:
    PolicySettings.objects.update(active=False)
    PolicySettings.objects.create(name="dr", policy="slowdown_dr", params=params, active=True)


# --- tokens ---


def test_a_token_opens_only_its_running_attempt(alice, node):
    job = _running(alice, node, 0)
    token = job_token(job.pk, 1)
    assert training_env(job.pk, 1) == {"COSCHED_JOB_TOKEN": token}
    assert job_token_placement(token).job_id == job.pk
    reply = _post(token, {"iteration": 5})
    assert reply.status_code == 200, reply.content
    assert reply.json()["job"] == job.pk and reply.json()["data_ratio"] == [10, 0]


@pytest.mark.parametrize(
    "token",
    [None, "", "cjt_1_1_forged", "cos_notajobtoken", "cjt_x_1_abc"],
)
def test_a_missing_malformed_or_forged_token_gets_401(alice, node, token):
    job = _running(alice, node, 0)
    if token == "cjt_1_1_forged":
        token = f"cjt_{job.pk}_1_" + "A" * 43
    response = _post(token, {"iteration": 1})
    assert response.status_code == 401
    assert not TrainingState.objects.exists()


def test_another_jobs_token_cannot_be_bent_to_this_job(alice, node):
    a = _running(alice, node, 0, name="a")
    b = _running(alice, node, 1, name="b")
    mac = job_token(a.pk, 1).rsplit("_", 1)[1]
    assert _post(f"cjt_{b.pk}_1_{mac}", {"iteration": 1}).status_code == 401


@pytest.mark.parametrize("end", ["completed", "requeued", "paused-is-fine"])
def test_the_token_of_an_ended_attempt_gets_403(alice, node, end):
    job = _running(alice, node, 0)
    token = job_token(job.pk, 1)
    if end == "completed":
        Job.objects.filter(pk=job.pk).update(state="COMPLETED")
        Placement.objects.filter(job=job).update(active=False)
    elif end == "requeued":
        Placement.objects.filter(job=job).update(active=False)
        Job.objects.filter(pk=job.pk).update(state="PENDING")
    else:
        Job.objects.filter(pk=job.pk).update(state="PAUSED")
        assert _post(token, {"iteration": 1}).status_code == 200
        return
    response = _post(token, {"iteration": 1})
    assert response.status_code == 403
    assert "expired" in response.json()["detail"]


def test_an_attempts_token_is_not_the_next_attempts(alice, node):
    job = _running(alice, node, 0)
    old = job_token(job.pk, 1)
    Placement.objects.filter(job=job).update(active=False)
    p2 = Placement.objects.create(job=job, attempt=2, node=node, policy="test")
    PlacementPart.objects.create(placement=p2, node=node, gpu_indices=[1], cpus=1)
    assert _post(old, {"iteration": 1}).status_code == 403
    assert _post(job_token(job.pk, 2), {"iteration": 1}).json()["data_ratio"] == [0, 10]


# --- reports ---


def test_bad_fields_are_named_and_nothing_is_written(alice, node):
    job = _running(alice, node, 0)
    response = _post(
        job_token(job.pk, 1),
        {"iteration": -1, "epoch_end": "yes", "data_ratio": [5, 4], "iter_time_s": 0, "x": 1},
    )
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert set(errors) == {"iteration", "epoch_end", "data_ratio", "iter_time_s", "x"}
    assert not TrainingState.objects.exists() and not DataRatioChange.objects.exists()
    assert _post(job_token(job.pk, 1), [1, 2]).status_code == 400


def test_epoch_end_computes_the_slowdown_from_the_profile(alice, node):
    job = _running(alice, node, 0, solo_s=600.0)
    # 100 of 300 iterations in 300 s at 3 s each: (300 + 200 * 3) / 600 = 1.5
    body = {
        "iteration": 100,
        "epoch": 1,
        "epoch_end": True,
        "iterations_total": 300,
        "iter_time_s": 3.0,
        "elapsed_s": 300.0,
    }
    reply = _post(job_token(job.pk, 1), body).json()
    assert reply["slowdown"] == pytest.approx(1.5)
    assert reply["workers"] == 1 and reply["solo_time_s"] == 600.0
    state = TrainingState.objects.get()
    assert state.epoch == 1 and state.iteration == 100
    # fifo does not manage ratios: the epoch end stays unanswered, the ratio unchanged
    assert state.epoch_ended and state.ratio == [10, 0]


def test_without_a_profile_the_jobs_own_slowdown_counts(alice, node):
    job = _running(alice, node, 0, solo_s=None)
    body = {"iteration": 10, "epoch_end": True, "slowdown": 1.7}
    assert _post(job_token(job.pk, 1), body).json()["slowdown"] == pytest.approx(1.7)


# --- the DR manager at epoch ends ---


def _three_jobs(owner, node):
    # Two jobs share GPU 0, one is alone on GPU 1.
    return [_running(owner, node, g, name=n) for n, g in (("a", 0), ("b", 0), ("c", 1))]


def _end_epoch(job: Job, sd: float, iteration: int = 10, epoch: int = 1) -> dict:
    body = {
        "iteration": iteration,
        "epoch": epoch,
        "epoch_end": True,
        "iterations_total": 100,
        "iter_time_s": sd * 6.0,
        "elapsed_s": iteration * sd * 6.0,
    }
    response = _post(job_token(job.pk, 1), body)
    assert response.status_code == 200, response.content
    return response.json()


def test_the_manager_moves_the_slowest_jobs_batch_at_its_epoch_end(alice, node):
    _use_slowdown_dr()
    a, b, c = _three_jobs(alice, node)
    now = timezone.now()
    for g in Gpu.objects.filter(node=node):
        MetricSample.objects.create(at=now, metric="util_pct", value=100.0, gpu=g, node=node)
    assert _end_epoch(c, 1.0)["changed"] is False  # the least slowed job keeps its ratio
    # b and c are the only reporting jobs: 2 jobs on 2 GPUs, b already has GPU 0 to itself
    assert _end_epoch(b, 1.9)["changed"] is False
    reply = _end_epoch(a, 2.0)  # a's SD (2.0) is the largest: half its batch goes to GPU 1
    assert reply["changed"] is True and reply["data_ratio"] == [5, 5]
    assert reply["explanation"].startswith(f"moved 5/10 of job {a.pk}'s batch from GPU 0 to GPU 1")
    history = ratio_history(a.pk)
    assert [h["new"] for h in history] == [[10, 0], [5, 5]]
    assert history[-1]["actor"] == "policy:slowdown_dr" and history[-1]["old"] == [10, 0]
    assert not TrainingState.objects.filter(epoch_ended=True).exists()


def test_the_scheduling_cycle_applies_ratio_actions_too(alice, node):
    a, b, c = _three_jobs(alice, node)
    for job, sd in ((c, 1.0), (b, 1.5), (a, 2.0)):
        _end_epoch(job, sd)  # fifo active: recorded, not answered
    assert TrainingState.objects.filter(epoch_ended=True).count() == 3
    _use_slowdown_dr()
    snapshot = scheduling.build_snapshot()
    dp = {r.job.id: r.data_parallel for r in snapshot.state.running}
    assert dp[str(a.pk)] is not None and dp[str(a.pk)].ratio == (10, 0)
    result = scheduling.run_cycle()
    assert ("set_data_ratio", a.pk) in result.actions
    assert TrainingState.objects.get(placement__job=a).ratio == [5, 5]
    assert DataRatioChange.objects.filter(job=a, actor="scheduler").count() == 1


def test_a_job_without_the_sdk_is_scheduled_and_never_rebalanced(alice, node):
    _use_slowdown_dr()
    a, b, c = _three_jobs(alice, node)
    _end_epoch(a, 2.0)
    _end_epoch(c, 1.0)
    # b never reports: it is not in the manager's table, nothing of it is written
    assert not TrainingState.objects.filter(placement__job=b).exists()
    scheduling.run_cycle()
    assert not DataRatioChange.objects.filter(job=b).exists()


def test_the_job_page_shows_the_ratio_history_to_its_owner_only(alice, bob, node, client):
    _use_slowdown_dr()
    a, b, c = _three_jobs(alice, node)
    now = timezone.now()
    for g in Gpu.objects.filter(node=node):
        MetricSample.objects.create(at=now, metric="util_pct", value=100.0, gpu=g, node=node)
    _end_epoch(c, 1.0)
    _end_epoch(b, 1.9)
    _end_epoch(a, 2.0)
    client.force_login(alice)
    page = client.get(f"/jobs/{a.pk}/").content.decode()
    assert 'id="ratio-history"' in page
    assert "10, 0 → 5, 5" in page and f"moved 5/10 of job {a.pk}&#x27;s batch" in page
    client.force_login(bob)
    assert client.get(f"/jobs/{a.pk}/").status_code == 404
