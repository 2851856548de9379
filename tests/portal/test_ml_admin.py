"""Admin of the interference models: train (progress), compare, activate; staff only."""

from __future__ import annotations

import pytest

from portal.ml.models import TrainedModel, TrainingRun
from portal.ml.services import model_register
from tests.portal.ml_helpers import sm_model

pytestmark = pytest.mark.django_db
MODELS = "/admin/ml/trainedmodel/"


@pytest.fixture
def two(db):
    a = model_register(sm_model("alpha", hurt_by_busy=True))
    b = model_register(sm_model("beta", hurt_by_busy=False))
    TrainedModel.objects.filter(pk=a.pk).update(
        scores={"cv5": {"n": 100, "mse": 0.01, "r2": 0.8, "mae": 0.05}}
    )
    TrainedModel.objects.filter(pk=b.pk).update(
        scores={"cv5": {"n": 100, "mse": 0.02, "r2": 0.6, "mae": 0.07}}
    )
    return a, b


def test_models_list_compare_and_activate(client, staff, two):
    a, b = two
    client.force_login(staff)
    html = client.get(MODELS).content.decode()
    assert "alpha" in html and "beta" in html and "0.0100" in html and "Train new models" in html
    page = client.post(
        MODELS, {"action": "compare", "_selected_action": [a.pk, b.pk]}
    ).content.decode()
    assert 'id="compare-models"' in page
    assert "<strong>0.0100</strong>" in page and "<strong>0.8000</strong>" in page
    client.post(MODELS, {"action": "activate", "_selected_action": [b.pk]})
    assert list(TrainedModel.objects.filter(active=True)) == [b]
    response = client.post(
        MODELS, {"action": "activate", "_selected_action": [a.pk, b.pk]}, follow=True
    )
    assert "exactly one" in response.content.decode()
    assert list(TrainedModel.objects.filter(active=True)) == [b]
    detail = client.get(f"{MODELS}{a.pk}/change/").content.decode()
    assert "<th>validation</th>" in detail and "cv5" in detail


def test_train_form_queues_a_run_and_runs_page_shows_progress(
    client, staff, django_capture_on_commit_callbacks
):
    client.force_login(staff)
    form = client.get(f"{MODELS}train/").content.decode()
    assert "leave-one-application-out" in form
    bad = client.post(f"{MODELS}train/", {"algorithms": ["svm"], "validations": ["cv5"], "seed": 0})
    assert bad.status_code == 200 and "svm" in bad.content.decode()
    assert not TrainingRun.objects.exists()
    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post(
            f"{MODELS}train/",
            {
                "algorithms": ["linear", "tree"],
                "validations": ["cv5"],
                "include_live": "on",
                "seed": 1,
            },
        )
    assert response.status_code == 302 and response["Location"].endswith("/admin/ml/trainingrun/")
    run = TrainingRun.objects.get()
    assert run.algorithms == ["linear", "tree"] and run.requested_by == staff and run.seed == 1
    assert len(callbacks) == 1  # the worker (or thread) starts after commit
    TrainingRun.objects.filter(pk=run.pk).update(
        status="running", progress_done=3, progress_total=12, message="tree cv5 fold 2"
    )
    runs = client.get("/admin/ml/trainingrun/").content.decode()
    assert '<progress value="25" max="100"' in runs and "3/12 fits" in runs
    assert 'http-equiv="refresh"' in runs  # the page follows a running run


def test_non_staff_cannot_reach_the_model_admin(client, alice):
    client.force_login(alice)
    assert client.get(MODELS).status_code == 302
    assert client.get(f"{MODELS}train/").status_code == 302
