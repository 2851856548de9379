"""portal.ml services: live co-run samples, training runs, retrain proposals, the registry."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.core.models import Job, MetricSample, Placement
from portal.ml import services
from portal.ml.models import CoRunSample, TrainedModel, TrainingRun
from scheduler.learning.predictor import loads
from tests.portal.ml_helpers import profile, sm_model, titan_node

pytestmark = pytest.mark.django_db


def _placed(owner, node, prof, start, end=None, index=0, mode="mps"):
    job = Job.objects.create(
        owner=owner, name=prof.name, command="true", gpus=1, profile=prof, state="RUNNING"
    )
    Job.objects.filter(pk=job.pk).update(started_at=start)
    job.refresh_from_db()
    p = Placement.objects.create(
        job=job, node=node, sharing_mode=mode, policy="t", active=end is None, released_at=end
    )
    Placement.objects.filter(pk=p.pk).update(created_at=start)
    p.gpus.set([node.gpus.get(index=index)])
    return job


def _reports(job, start, values, every_s=10):
    MetricSample.objects.bulk_create(
        MetricSample(
            at=start + timedelta(seconds=every_s * (k + 1)), metric="slowdown", value=v, job=job
        )
        for k, v in enumerate(values)
    )


def test_corun_samples_come_from_slowdown_reports_of_two_jobs_alone_on_a_gpu(alice):
    node = titan_node()
    now = timezone.now()
    t0 = now - timedelta(minutes=10)
    a = _placed(alice, node, profile("alpha", 80.0), t0)
    b = _placed(alice, node, profile("beta", 20.0), t0 + timedelta(seconds=5))
    _reports(a, t0 + timedelta(seconds=5), [1.2, 1.4, 1.3, 1.35])
    _reports(b, t0 + timedelta(seconds=5), [1.1, 1.1])  # too few reports for a sample
    lonely = _placed(alice, node, profile("gamma", 50.0), t0, index=1)
    _reports(lonely, t0, [1.0, 1.0, 1.0])

    assert services.corun_samples_collect(now=now) == 1
    sample = CoRunSample.objects.get()
    assert (sample.job_a_id, sample.job_b_id) == (a.pk, b.pk)
    # The first report (15 s into a's run, 10 s into the pairing: 67 % < 80 % cover) is left
    # out; the median of the other three is the sample.
    assert sample.slowdown == pytest.approx(1.35) and sample.norm == pytest.approx(1 / 1.35)
    assert sample.samples == 3 and sample.gpu_model == "TitanXp" and sample.sharing_mode == "mps"
    # Collecting again updates, never duplicates.
    _reports(a, t0 + timedelta(seconds=45), [1.5, 1.5, 1.5])
    services.corun_samples_collect(now=now)
    assert CoRunSample.objects.count() == 1
    assert CoRunSample.objects.get().samples == 6


def test_reports_before_the_pairing_covers_most_of_the_run_are_ignored(alice):
    node = titan_node()
    now = timezone.now()
    t0 = now - timedelta(minutes=30)
    a = _placed(alice, node, profile("alpha", 80.0), t0)
    # b joins 20 minutes after a started: reports taken within the next 5 minutes mostly
    # measure a's solo stretch (Slow-Down counts from a's start).
    joined = t0 + timedelta(minutes=20)
    _placed(alice, node, profile("beta", 20.0), joined)
    _reports(a, joined, [1.05, 1.06, 1.07, 1.08], every_s=60)
    assert services.corun_samples_collect(now=now) == 0


def test_a_third_co_runner_voids_the_reports_it_overlaps(alice):
    node = titan_node()
    now = timezone.now()
    t0 = now - timedelta(minutes=10)
    a = _placed(alice, node, profile("alpha", 80.0), t0)
    _placed(alice, node, profile("beta", 20.0), t0)
    _placed(alice, node, profile("gamma", 50.0), t0)
    _reports(a, t0, [1.9, 1.9, 1.9, 1.9])
    assert services.corun_samples_collect(now=now) == 0


def test_training_run_trains_registers_and_reports_progress(alice):
    node = titan_node()
    now = timezone.now()
    t0 = now - timedelta(minutes=10)
    a = _placed(alice, node, profile("alpha", 80.0), t0)
    _placed(alice, node, profile("beta", 20.0), t0)
    _reports(a, t0, [1.4, 1.4, 1.4])
    services.corun_samples_collect(now=now)

    run = services.training_run_create(algorithms=["linear"], validations=["cv5"], user=alice)
    assert run.status == TrainingRun.Status.QUEUED
    seen = []
    run = services.training_run_execute(run.pk, progress=lambda d, t, m: seen.append((d, t)))
    assert run.status == TrainingRun.Status.DONE and run.error == ""
    assert run.progress_done == run.progress_total == seen[-1][0] == 7
    model = TrainedModel.objects.get()
    assert model.run_id == run.pk and not model.active and model.live_samples == 1
    assert model.dataset["by_family"]["live"] == 1 and len(model.dataset_hash) == 64
    assert model.scores["cv5"]["n"] > 2000 and 0 < model.scores["cv5"]["mse"] < 0.05
    assert "sm_efficiency_pct" in model.features
    predictor = loads(bytes(model.artifact))
    assert predictor.name == model.name and predictor.metadata["dataset_hash"] == model.dataset_hash
    # A second delivery of the same run does nothing.
    assert services.training_run_execute(run.pk).status == TrainingRun.Status.DONE
    assert TrainedModel.objects.count() == 1


def test_bad_training_requests_and_failures_are_recorded():
    with pytest.raises(services.TrainingError, match="unknown algorithm"):
        services.training_run_create(algorithms=["svm"])
    with pytest.raises(services.TrainingError, match="unknown validation"):
        services.training_run_create(validations=["cv3"])
    run = services.training_run_create(algorithms=["linear"], validations=["cv5"])
    TrainingRun.objects.filter(pk=run.pk).update(algorithms=["svm"])  # corrupted row
    with pytest.raises(Exception, match="unknown algorithm"):
        services.training_run_execute(run.pk)
    run.refresh_from_db()
    assert run.status == TrainingRun.Status.FAILED and "svm" in run.error


def test_retrain_is_proposed_only_after_enough_new_live_samples(
    alice, settings, django_capture_on_commit_callbacks
):
    settings.COSCHED = {**settings.COSCHED, "ML_RETRAIN_MIN_NEW_SAMPLES": 1}
    assert services.retrain_propose() is None  # no live sample yet
    node = titan_node()
    now = timezone.now()
    t0 = now - timedelta(minutes=10)
    a = _placed(alice, node, profile("alpha", 80.0), t0)
    _placed(alice, node, profile("beta", 20.0), t0)
    _reports(a, t0, [1.4, 1.4, 1.4])
    services.corun_samples_collect(now=now)
    with django_capture_on_commit_callbacks() as callbacks:
        run = services.retrain_propose()
    assert run is not None and run.source == "retrain" and run.algorithms == ["forest"]
    assert len(callbacks) == 1  # handed to a worker after commit
    assert services.retrain_propose() is None  # one run at a time


def test_one_active_model_at_a_time():
    first = services.model_register(sm_model("m1", hurt_by_busy=True))
    second = services.model_register(sm_model("m1", hurt_by_busy=False))
    assert second.name == "m1-2"  # names are unique
    services.model_activate(first)
    services.model_activate(second)
    assert list(TrainedModel.objects.filter(active=True)) == [second]
    assert services.model_export(second) == bytes(second.artifact)
