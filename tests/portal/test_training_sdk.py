"""The training SDK (workers.sdk) against a real portal over HTTP (pytest-django's live server)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from portal.core.models import DataRatioChange, Gpu, Job, Node, Placement, PlacementPart
from portal.core.training import job_token
from workers.sdk import SdkError, TrainingClient

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def job(alice) -> Job:
    node = Node.objects.create(name="n", kind="gpu", cores=8, memory_mb=32768)
    for i in range(4):
        Gpu.objects.create(node=node, index=i, model="V100", memory_mb=16384)
    job = Job.objects.create(
        owner=alice, name="train", gpus=2, state="RUNNING", started_at=timezone.now()
    )
    p = Placement.objects.create(job=job, attempt=1, node=node, policy="test")
    PlacementPart.objects.create(placement=p, node=node, gpu_indices=[1, 2], cpus=1)
    return job


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_sdk_reads_its_ratio_and_workers_at_epoch_ends(live_server, job):
    clock = Clock()
    env = {"COSCHED_API_URL": live_server.url, "COSCHED_JOB_TOKEN": job_token(job.pk, 1)}
    client = TrainingClient(environ=env, clock=clock, iterations_total=40)
    for i in range(1, 11):
        clock.t += 0.5
        reply = client.report(i, epoch_end=i == 10)
    assert reply is not None and not client.last_error
    assert reply.data_ratio == (0, 5, 5, 0) and reply.workers == 2 and reply.epoch == 1
    assert client.data_ratio == (0, 5, 5, 0)
    assert client.split(65) == [0, 33, 32, 0]
    history = list(DataRatioChange.objects.filter(job=job).values_list("new", flat=True))
    assert history == [[0, 5, 5, 0]]


def test_a_bad_token_is_refused_with_401_and_reporting_stops(live_server, job):
    client = TrainingClient(live_server.url, f"cjt_{job.pk}_1_" + "x" * 43, data_ratio=[10])
    assert client.report(1, epoch_end=True) is None
    assert client.last_error.startswith("401") and not client.enabled
    assert client.data_ratio == (10,)
    strict = TrainingClient(live_server.url, "cjt_nonsense", strict=True)
    with pytest.raises(SdkError) as caught:
        strict.report(1, epoch_end=True)
    assert caught.value.status == 401


def test_an_expired_token_is_refused_with_403(live_server, job):
    token = job_token(job.pk, 1)
    Job.objects.filter(pk=job.pk).update(state="COMPLETED")
    Placement.objects.filter(job=job).update(active=False)
    client = TrainingClient(live_server.url, token, strict=True)
    with pytest.raises(SdkError) as caught:
        client.report(3, epoch_end=True)
    assert caught.value.status == 403
