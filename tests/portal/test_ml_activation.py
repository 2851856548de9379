"""Activating a model switches what the live ``coscheml`` policy predicts: the portal's
PolicySettings name the policy, portal.ml's loader supplies the active model (real PostgreSQL)."""

from __future__ import annotations

import pytest

from portal.core.models import Job, PolicySettings
from portal.core.scheduling import run_cycle
from portal.core.services import job_transition
from portal.core.states import JobState
from portal.ml.models import TrainedModel
from portal.ml.services import model_activate, model_deactivate, model_register
from scheduler.learning import runtime
from tests.portal.ml_helpers import profile, running_on, sm_model, titan_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(alice):
    node = titan_node()
    busy, calm = profile("busy", 90.0), profile("calm", 10.0)
    on_busy = running_on(alice, node, 0, busy)
    on_calm = running_on(alice, node, 1, calm)
    PolicySettings.objects.all().delete()
    PolicySettings.objects.create(name="ml", policy="coscheml", params={}, active=True)
    newcomer = Job.objects.create(
        owner=alice,
        name="newcomer",
        command="true",
        gpus=1,
        gpu_memory_mb=2000,
        profile=profile("mid", 50.0),
        sharing="allowed",  # coscheml pairs it with a resident (docs/jobs.md)
    )
    return {"node": node, "on_busy": on_busy, "on_calm": on_calm, "newcomer": newcomer}


def _place(job: Job) -> tuple[int, str]:
    result = run_cycle()
    assert result.placed == [job.pk]
    job.refresh_from_db()
    placement = job.current_placement
    index = placement.gpus.get().index
    # Put it back in the queue for the next cycle (releases the placement).
    job_transition(job, JobState.PENDING, actor="test", message="requeued by the test")
    return index, placement.explanation


def test_activation_switches_the_live_policy(cluster):
    hurt = model_register(sm_model("hurt-by-busy", hurt_by_busy=True))
    helped = model_register(sm_model("helped-by-busy", hurt_by_busy=False))
    assert not hurt.active and not helped.active  # registered models are proposals

    model_activate(hurt)
    index, explanation = _place(cluster["newcomer"])
    assert index == 1  # next to the calm job
    assert f"paired with job {cluster['on_calm'].pk} (calm)" in explanation
    assert "model hurt-by-busy (linear" in explanation

    model_activate(helped)
    assert list(TrainedModel.objects.filter(active=True)) == [helped]
    index, explanation = _place(cluster["newcomer"])
    assert index == 0  # the other model prefers the busy co-runner
    assert "model helped-by-busy (linear" in explanation
    assert runtime.active_key().startswith(f"db:{helped.pk}:")


def test_without_an_active_model_coscheml_uses_the_builtin_one(cluster):
    model = model_register(sm_model("soon-off", hurt_by_busy=True))
    model_activate(model)
    model_deactivate(model)
    assert runtime.active_key() is None
    index, explanation = _place(cluster["newcomer"])
    assert "model builtin-forest" in explanation
