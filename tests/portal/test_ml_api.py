"""``/api/v1/interference/heatmap/``: predicted (active model) and measured (live co-runs)
slowdowns of the profiles present; ``/api/v1/interference/models/``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.core.models import ApplicationProfile, Job
from portal.ml.models import CoRunSample
from portal.ml.services import model_activate, model_register
from tests.portal.ml_helpers import profile, sm_model, titan_node

pytestmark = pytest.mark.django_db
URL = "/api/v1/interference/heatmap/"


@pytest.fixture
def present(alice):
    titan_node()
    busy, calm = profile("busy", 90.0), profile("calm", 10.0)
    jobs = []
    for p in (busy, busy, calm):
        jobs.append(Job.objects.create(owner=alice, name=p.name, command="true", gpus=1, profile=p))
    now = timezone.now()
    for k, slowdown in enumerate((1.3, 1.5)):
        CoRunSample.objects.create(
            job_a=jobs[k],
            job_b=jobs[2],
            profile_a=busy,
            profile_b=calm,
            gpu_model="TitanXp",
            sharing_mode="mps",
            slowdown=slowdown,
            norm=1 / slowdown,
            samples=5,
            window_start=now - timedelta(minutes=5),
            window_end=now,
        )
    return busy, calm


def test_heatmap_returns_predicted_and_measured_cells(alice_api, present):
    busy, calm = present
    model = model_activate(model_register(sm_model("hurt", hurt_by_busy=True)))
    body = alice_api.get(URL).json()
    assert body["model"]["name"] == model.name and body["model"]["algorithm"] == "linear"
    assert "cv5" not in body["model"]["scores"]  # this model was not validated
    assert body["gpu_model"] == "TitanXp"
    assert [p["name"] for p in body["profiles"]] == ["busy", "calm"]  # most jobs first
    cells = {(c["row"], c["col"]): c for c in body["cells"]}
    assert len(cells) == 4
    measured = cells[(busy.pk, calm.pk)]
    assert measured["measured"] == pytest.approx(1.4) and measured["samples"] == 2
    # norm = 1 - 0.4 * sm(co-runner) / 100, slowdown = 1 / norm
    assert measured["predicted"] == pytest.approx(1 / 0.96, abs=1e-3)
    assert cells[(calm.pk, busy.pk)]["predicted"] == pytest.approx(1 / 0.64, abs=1e-3)
    assert cells[(calm.pk, busy.pk)]["measured"] is None
    assert cells[(calm.pk, busy.pk)]["samples"] == 0
    assert body["predicted"][0][1] == measured["predicted"] and body["measured"][0][1] == 1.4
    assert body["measured_pairs"] == 1
    assert body["mean_abs_error"] == pytest.approx(abs(1 / 0.96 - 1.4), abs=1e-3)


def test_heatmap_without_a_model_has_measurements_only(alice_api, present):
    body = alice_api.get(URL).json()
    assert body["model"] is None
    assert all(c["predicted"] is None for c in body["cells"])
    assert any(c["measured"] is not None for c in body["cells"])
    assert "No interference model is active" in body["note"]


def test_profile_parameter_and_visibility(alice_api, staff_api, present):
    draft = ApplicationProfile.objects.create(name="draft-one", status="draft")
    body = staff_api.get(URL, {"profile": draft.pk}).json()
    assert body["profiles"][0]["name"] == "draft-one"
    assert alice_api.get(URL, {"profile": draft.pk}).status_code == 404  # not hers to see
    busy, _ = present
    assert [p["name"] for p in alice_api.get(URL, {"profile": busy.pk}).json()["profiles"]] == [
        "busy",
        "calm",
    ]


def test_bad_parameters_are_field_errors(alice_api, present):
    r = alice_api.get(URL, {"profile": "abc"})
    assert r.status_code == 400 and "profile" in r.json()
    r = alice_api.get(URL, {"gpu_model": "Z80"})
    assert r.status_code == 400 and "unknown GPU model 'Z80'" in r.json()["gpu_model"][0]
    assert alice_api.get(URL, {"gpu_model": "v100"}).json()["gpu_model"] == "V100"
    assert alice_api.get(URL, {"profile": 99999}).status_code == 404


def test_models_endpoint_and_schema(alice_api, client):
    model_register(sm_model("one", hurt_by_busy=True))
    body = alice_api.get("/api/v1/interference/models/").json()
    assert [m["name"] for m in body] == ["one"] and body[0]["active"] is False
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    assert "/api/v1/interference/heatmap/" in schema["paths"]


def test_anonymous_users_are_refused(client):
    assert client.get(URL).status_code in (401, 403)
