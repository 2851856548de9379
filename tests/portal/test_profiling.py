"""The profiling command: ``cosched profile APP --models ... --with OTHER`` (CLI, API) submits
short solo and pair runs as ordinary jobs pinned to each GPU model; the scheduler honours the
pin; what the runs measure becomes the profile's measured draft (a real agent, emulated runs)."""

from __future__ import annotations

import pytest
from django.conf import settings

from portal.core.models import (
    ApplicationProfile,
    Gpu,
    Job,
    Node,
    PolicySettings,
    ProfileGpuTime,
    ProfileMemoryStep,
)
from portal.core.scheduling import run_cycle
from portal.front.services import token_create
from tests.portal.test_cli import run_cli
from tests.workers.test_agent import Switch, _step_until
from workers.agent import NodeAgent, kill_marked_processes
from workers.gpu.virtual_backend import VirtualBackend
from workers.isolation import GpuDevices


def _profile(name: str, a30_s: float) -> ApplicationProfile:
    profile = ApplicationProfile.objects.create(
        name=name, kind="dl-train", status="approved", gpu_util_pct=50.0, gpu_memory_max_mb=1500
    )
    ProfileGpuTime.objects.create(profile=profile, gpu_model="A30", time_s=a30_s)
    ProfileGpuTime.objects.create(profile=profile, gpu_model="V100", time_s=a30_s)
    ProfileMemoryStep.objects.create(
        profile=profile, index=1, start_fraction=0.0, from_mb=500, to_mb=1500
    )
    return profile


@pytest.fixture
def cluster(db):
    v100 = Node.objects.create(name="prof-v100", kind="gpu", cores=8, memory_mb=65536)
    Gpu.objects.create(node=v100, index=0, model="V100", memory_mb=16384, uuid="GPU-prof-v")
    PolicySettings.objects.create(name="t", policy="binpack", params={}, active=True)
    return v100


def test_the_api_submits_pinned_solo_and_pair_runs_for_staff_only(
    cluster, staff_api, alice_api, staff
):
    app, other = _profile("prof-app", 20.0), _profile("prof-other", 10.0)
    Gpu.objects.create(
        node=Node.objects.create(name="prof-z-a30", kind="gpu", cores=8, memory_mb=65536),
        index=0,
        model="A30",
        memory_mb=24576,
        uuid="GPU-prof-a",
    )
    body = {"profile": "prof-app", "models": "A30", "with_profile": "prof-other"}
    assert alice_api.post("/api/v1/profiling/", body, format="json").status_code == 403
    bad = staff_api.post("/api/v1/profiling/", {**body, "models": "H100"}, format="json")
    assert bad.status_code == 400 and "no GPU of model H100" in bad.json()["models"][0]
    answer = staff_api.post("/api/v1/profiling/", body, format="json")
    assert answer.status_code == 201, answer.content
    jobs = [Job.objects.get(pk=j["id"]) for j in answer.json()["jobs"]]
    assert [(j.profile, j.params["gpu_model"], j.params["profiling_role"]) for j in jobs] == [
        (app, "A30", "solo"),
        (app, "A30", "pair with prof-other"),
        (other, "A30", "pair with prof-app"),
    ]
    assert all(j.owner == staff and j.state == "PENDING" for j in jobs)
    assert "workers.emulate --profile prof-app" in jobs[0].command
    # The idle V100 comes first in cluster order, but every run is pinned to the A30.
    placed = run_cycle().placed
    assert jobs[0].pk in placed
    for job in jobs:
        job.refresh_from_db()
        placement = job.placements.first()
        if placement is not None:
            assert {g.model for g in placement.gpus.all()} == {"A30"}
    listed = staff_api.get("/api/v1/profiling/", {"profile": "prof-app"}).json()
    assert {j["id"] for j in listed["jobs"]} >= {jobs[0].pk, jobs[1].pk}
    assert listed["draft"] is None  # nothing measured yet


def test_a_profiling_run_measures_the_app_into_its_draft(
    cluster, staff, tmp_path, monkeypatch, django_capture_on_commit_callbacks
):
    monkeypatch.setitem(settings.COSCHED, "OBSERVATION_WINDOW_S", 0.2)
    app = _profile("prof-run", 20.0)
    agent = NodeAgent(
        "prof-v100",
        VirtualBackend("V100x1", node="prof-v100"),
        Switch(),
        cores=8,
        memory_mb=65536,
        data_dir=tmp_path,
        sample_every_s=0.0,
        gpu_devices=GpuDevices("none", reason="test"),
    )
    try:
        assert agent.step()
        from portal.core.profiling import profiling_submit

        run, (job,) = profiling_submit(staff, app, models=["V100"], scale=0.1)
        assert run_cycle().placed == [job.pk]
        with django_capture_on_commit_callbacks(execute=True):
            job = _step_until(agent, job, "COMPLETED", "FAILED", timeout=30)
    finally:
        agent.shutdown(kill_jobs=True)
        kill_marked_processes(agent.marker)
    assert job.state == "COMPLETED"
    draft = ApplicationProfile.objects.get(name="prof-run", status="draft")
    measured = draft.gpu_times.get(gpu_model="V100").time_s
    assert 1.0 < measured < 6.0  # 20 s x 0.1, as measured, not the profile's 20
    assert draft.sources["gpu_time_s.V100"].startswith("measured on prof-v100, 1 run, ")
    assert draft.gpu_times.get(gpu_model="A30").time_s == 20.0  # not measured: kept
    assert draft.gpu_memory_max_mb is not None and draft.gpu_memory_max_mb <= 1500.0


@pytest.mark.django_db(transaction=True)
def test_the_cli_starts_a_profiling_run(live_server, django_user_model):
    admin = django_user_model.objects.create_user("prof-admin", password="x", is_staff=True)
    _, key = token_create(admin, name="ci")
    node = Node.objects.create(name="prof-cli", kind="gpu", cores=8, memory_mb=65536)
    Gpu.objects.create(node=node, index=0, model="A30", memory_mb=24576, uuid="GPU-prof-cli")
    _profile("prof-cli-app", 20.0)
    done = run_cli("profile", "prof-cli-app", "--models", "A30", url=live_server.url, token=key)
    assert done.code == 0, done.err
    assert "Profiling run " in done.out and ": 1 jobs" in done.out
    assert "profile prof-cli-app solo on A30" in done.out
    refused = run_cli("profile", "prof-cli-app", "--models", "K80", url=live_server.url, token=key)
    assert refused.code != 0 and "models" in refused.err


def test_staff_start_a_profiling_run_from_the_profile_page(cluster, client, staff, alice):
    app = _profile("prof-page", 20.0)
    client.force_login(alice)
    assert client.post(f"/profiles/{app.pk}/profiling/", {"models": ["V100"]}).status_code == 403
    client.force_login(staff)
    page = client.get(f"/profiles/{app.pk}/").content.decode()
    assert 'id="profiling"' in page and 'value="V100"' in page
    answer = client.post(f"/profiles/{app.pk}/profiling/", {"models": ["V100"]}, follow=True)
    (job,) = Job.objects.filter(profile=app)
    assert job.params["gpu_model"] == "V100" and job.params["profiling_role"] == "solo"
    text = answer.content.decode()
    assert "Profiling run " in text and f"#{job.pk} profile prof-page solo on V100" in text
    refused = client.post(f"/profiles/{app.pk}/profiling/", {}, follow=True).content.decode()
    assert "models: name at least one GPU model" in refused
