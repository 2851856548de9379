"""Dashboard endpoints: cluster overview with the privacy rule, series (bounded, windowed,
per-owner), job log tails, the interference heatmap, and their place in the OpenAPI schema."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.core import metrics
from portal.core.metrics import Sample, log_tail_store, metrics_record
from portal.core.models import Gpu, Job, Node, Placement, PolicySettings

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _local_store(settings):
    settings.REDIS_URL = ""
    metrics.metrics_store_clear()
    yield
    metrics.metrics_store_clear()


@pytest.fixture
def cluster():
    gpu_node = Node.objects.create(
        name="gpu-1", kind="gpu", cores=16, backend="virtual", last_heartbeat=timezone.now()
    )
    v100 = Gpu.objects.create(
        node=gpu_node,
        index=0,
        model="V100",
        memory_mb=16384,
        sharing_modes=["exclusive", "time_slicing", "mps"],
        current_mode="mps",
    )
    idle = Gpu.objects.create(node=gpu_node, index=1, model="V100", memory_mb=16384)
    cpu_node = Node.objects.create(name="cpu-1", kind="cpu", cores=64)
    Node.objects.create(name="gpu-lost", kind="gpu", status="down", backend="nvml")
    return {"gpu_node": gpu_node, "v100": v100, "idle": idle, "cpu_node": cpu_node}


def _place(job: Job, node: Node, *gpus: Gpu, mode: str = "exclusive") -> Placement:
    placement = Placement.objects.create(job=job, node=node, sharing_mode=mode, policy="fifo")
    placement.gpus.set(gpus)
    return placement


@pytest.fixture
def jobs(alice, bob, cluster):
    now = timezone.now()
    mine = Job.objects.create(
        owner=alice, name="alice-train", gpus=1, state="RUNNING", started_at=now
    )
    theirs = Job.objects.create(
        owner=bob, name="bob-secret-project", gpus=1, state="RUNNING", started_at=now
    )
    cpu_job = Job.objects.create(owner=alice, name="alice-cpu", state="RUNNING", started_at=now)
    Job.objects.create(owner=bob, name="waiting", gpus=1)  # PENDING
    _place(mine, cluster["gpu_node"], cluster["v100"], mode="mps")
    _place(theirs, cluster["gpu_node"], cluster["v100"], mode="mps")
    _place(cpu_job, cluster["cpu_node"])
    return {"mine": mine, "theirs": theirs, "cpu": cpu_job}


def _gpu(body, node_name, index):
    node = next(n for n in body["results"] if n["name"] == node_name)
    return next(g for g in node["gpus"] if g["index"] == index)


def test_overview_shows_nodes_gpus_live_values_and_queue(alice_api, cluster, jobs):
    now = timezone.now()
    metrics_record(
        [
            Sample("util_pct", 87.5, now, gpu_id=cluster["v100"].pk),
            Sample("memory_used_mb", 12000.0, now, gpu_id=cluster["v100"].pk),
            Sample("slowdown", 1.3, now, job_id=jobs["mine"].pk),
            Sample("slowdown", 1.9, now, job_id=jobs["theirs"].pk),
            Sample("sd_max_diff", 0.6, now),
        ]
    )
    body = alice_api.get("/api/v1/dashboard/cluster/").json()
    assert body["queue_length"] == 1
    assert body["running_jobs"] == 3
    assert body["nodes_down"] == ["gpu-lost"]
    assert body["sd_max_diff"] == 0.6
    assert body["count"] == body["nodes_total"] == 3 and body["gpus_total"] == 2
    assert [n["name"] for n in body["results"]] == ["cpu-1", "gpu-1", "gpu-lost"]

    gpu_node = next(n for n in body["results"] if n["name"] == "gpu-1")
    assert gpu_node["backend_label"] == "virtual GPU (simulated)"
    assert gpu_node["heartbeat_age_s"] is not None and gpu_node["heartbeat_age_s"] < 60
    lost = next(n for n in body["results"] if n["name"] == "gpu-lost")
    assert lost["status"] == "down" and lost["backend_label"] == "NVML (physical GPUs)"
    cpu = next(n for n in body["results"] if n["name"] == "cpu-1")
    assert cpu["backend_label"] is None
    assert [j["name"] for j in cpu["cpu_jobs"]] == ["alice-cpu"]

    v100 = _gpu(body, "gpu-1", 0)
    assert (v100["model"], v100["current_mode"], v100["memory_mb"]) == ("V100", "mps", 16384)
    assert v100["util_pct"] == 87.5 and v100["memory_used_mb"] == 12000.0
    assert _gpu(body, "gpu-1", 1)["jobs"] == [] and _gpu(body, "gpu-1", 1)["util_pct"] is None


def test_overview_hides_other_users_jobs(alice_api, staff_api, cluster, jobs):
    metrics_record([Sample("slowdown", 1.9, timezone.now(), job_id=jobs["theirs"].pk)])
    response = alice_api.get("/api/v1/dashboard/cluster/")
    refs = _gpu(response.json(), "gpu-1", 0)["jobs"]
    mine = next(j for j in refs if j["mine"])
    other = next(j for j in refs if not j["mine"])
    assert (mine["id"], mine["name"], mine["owner"]) == (jobs["mine"].pk, "alice-train", "alice")
    assert other == {
        "id": None,
        "name": "another user's job",
        "owner": None,
        "mine": False,
        "state": "RUNNING",
        "sharing_mode": "mps",
        "slowdown": None,
        "progress": None,
    }
    assert "bob-secret-project" not in response.content.decode()

    staff_refs = _gpu(staff_api.get("/api/v1/dashboard/cluster/").json(), "gpu-1", 0)["jobs"]
    bobs = next(j for j in staff_refs if j["owner"] == "bob")
    assert (bobs["id"], bobs["name"], bobs["slowdown"]) == (
        jobs["theirs"].pk,
        "bob-secret-project",
        1.9,
    )


def test_overview_filters_and_pages(alice_api, cluster):
    down = alice_api.get("/api/v1/dashboard/cluster/?status=down").json()
    assert [n["name"] for n in down["results"]] == ["gpu-lost"]
    paged = alice_api.get("/api/v1/dashboard/cluster/?page_size=2").json()
    assert paged["count"] == 3 and len(paged["results"]) == 2 and paged["next"]
    assert alice_api.get("/api/v1/dashboard/cluster/?kind=tpu").status_code == 400


def test_overview_needs_a_login(client):
    assert client.get("/api/v1/dashboard/cluster/").status_code in (401, 403)


def test_gpu_series_window_and_bound(alice_api, cluster):
    now = timezone.now()
    gpu = cluster["v100"]
    metrics_record(
        [
            Sample("util_pct", float(i % 10), now - timedelta(seconds=i), gpu_id=gpu.pk)
            for i in range(3000)
        ]
        + [Sample("memory_used_mb", 4096.0, now - timedelta(seconds=5), gpu_id=gpu.pk)]
    )
    body = alice_api.get(f"/api/v1/gpus/{gpu.pk}/series/?window_s=600&max_points=100").json()
    util, memory = body["series"]
    assert util["metric"] == "util_pct" and 0 < util["points"] <= 100
    assert len(util["t"]) == len(util["v"]) == util["points"]
    assert memory["v"] == [4096.0]
    # A short window holds only the recent raw samples.
    recent = alice_api.get(f"/api/v1/gpus/{gpu.pk}/series/?metric=util_pct&window_s=20").json()
    assert 15 <= recent["series"][0]["points"] <= 21
    assert alice_api.get("/api/v1/gpus/999999/series/").status_code == 404
    bad = alice_api.get(f"/api/v1/gpus/{gpu.pk}/series/?metric=temperature")
    assert bad.status_code == 400 and "metric" in bad.json()
    assert alice_api.get(f"/api/v1/gpus/{gpu.pk}/series/?max_points=0").status_code == 400


def test_all_gpus_series(alice_api, cluster):
    now = timezone.now()
    metrics_record(
        [
            Sample("util_pct", 50.0, now, gpu_id=cluster["v100"].pk),
            Sample("util_pct", 5.0, now, gpu_id=cluster["idle"].pk),
        ]
    )
    body = alice_api.get("/api/v1/dashboard/gpus/series/").json()
    assert [(s["label"], s["v"]) for s in body["series"]] == [
        ("gpu-1/0 V100", [50.0]),
        ("gpu-1/1 V100", [5.0]),
    ]
    one = alice_api.get(f"/api/v1/dashboard/gpus/series/?gpu={cluster['idle'].pk}").json()
    assert [s["v"] for s in one["series"]] == [[5.0]]


def test_job_series_owner_or_staff_only(alice_api, bob_api, staff_api, jobs):
    now = timezone.now()
    job = jobs["mine"]
    metrics_record(
        [
            Sample("slowdown", 1.0 + i / 10, now - timedelta(seconds=30 - i), job_id=job.pk)
            for i in range(3)
        ]
        + [Sample("progress", 0.25, now, job_id=job.pk)]
    )
    body = alice_api.get(f"/api/v1/jobs/{job.pk}/series/").json()
    by_metric = {s["metric"]: s["v"] for s in body["series"]}
    assert by_metric == {"slowdown": [1.0, 1.1, 1.2], "progress": [0.25]}
    assert staff_api.get(f"/api/v1/jobs/{job.pk}/series/").status_code == 200
    assert bob_api.get(f"/api/v1/jobs/{job.pk}/series/").status_code == 404


def test_jobs_series_lists_only_visible_jobs(alice_api, staff_api, jobs):
    now = timezone.now()
    metrics_record(
        [
            Sample("slowdown", 1.2, now, job_id=jobs["mine"].pk),
            Sample("slowdown", 1.7, now, job_id=jobs["theirs"].pk),
        ]
    )
    labels = [s["label"] for s in alice_api.get("/api/v1/dashboard/jobs/series/").json()["series"]]
    assert labels == [f"#{jobs['mine'].pk} alice-train"]
    staff = staff_api.get("/api/v1/dashboard/jobs/series/").json()["series"]
    assert len(staff) == 2


def test_cluster_series(alice_api):
    now = timezone.now()
    metrics_record(
        [Sample("sd_max_diff", 0.1 * i, now - timedelta(seconds=10 * i)) for i in range(5)]
        + [Sample("queue_length", 4.0, now)]
    )
    body = alice_api.get("/api/v1/dashboard/cluster/series/").json()
    by_metric = {s["metric"]: s for s in body["series"]}
    assert by_metric["sd_max_diff"]["points"] == 5
    assert by_metric["sd_max_diff"]["v"][-1] == 0.0  # oldest first: the newest is i = 0
    assert by_metric["queue_length"]["v"] == [4.0]
    nodes = alice_api.get("/api/v1/dashboard/cluster/series/?metric=nodes_down").json()
    assert [s["metric"] for s in nodes["series"]] == ["nodes_down"]


def test_log_tail_live_then_file_then_none(alice_api, bob_api, staff_api, jobs, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    job = jobs["mine"]
    empty = alice_api.get(f"/api/v1/jobs/{job.pk}/log/").json()
    assert (empty["source"], empty["text"]) == ("none", "")

    log = tmp_path / "logs" / f"job-{job.pk}.log"
    log.parent.mkdir(parents=True)
    log.write_text("epoch 1\n" * 5000)
    from_file = alice_api.get(f"/api/v1/jobs/{job.pk}/log/").json()
    assert from_file["source"] == "file"
    assert from_file["text"].startswith("epoch 1\n") and len(from_file["text"]) <= 16 * 1024

    log_tail_store(job.pk, "step 41\nstep 42\n")
    live = alice_api.get(f"/api/v1/jobs/{job.pk}/log/").json()
    assert live == {
        "job": job.pk,
        "state": "RUNNING",
        "source": "live",
        "text": "step 41\nstep 42\n",
    }
    assert staff_api.get(f"/api/v1/jobs/{job.pk}/log/").status_code == 200
    assert bob_api.get(f"/api/v1/jobs/{job.pk}/log/").status_code == 404


def test_interference_heatmap_defaults_and_policy_factors(alice_api):
    body = alice_api.get("/api/v1/dashboard/interference/").json()
    assert body["classes"] == ["C", "M", "unknown"]
    matrix = {
        (a, b): body["matrix"][i][j]
        for i, a in enumerate(body["classes"])
        for j, b in enumerate(body["classes"])
    }
    # ALGORITHMS.md §4 order: M+C best, C+C middle, M+M worst.
    assert matrix[("C", "M")] < matrix[("C", "C")] < matrix[("M", "M")]
    assert matrix[("C", "M")] == matrix[("M", "C")]

    PolicySettings.objects.create(
        name="tuned",
        policy="mystic",
        params={"interference": "class_based", "interference_params": {"mm": 2.5, "cc": 1.6}},
    )
    tuned = alice_api.get("/api/v1/dashboard/interference/").json()
    assert tuned["matrix"][1][1] == 2.5 and tuned["matrix"][0][0] == 1.6
    assert "tuned" in tuned["source"]


def test_schema_documents_the_dashboard_endpoints(alice_api):
    import yaml

    schema = yaml.safe_load(alice_api.get("/api/schema/").content)
    paths = schema["paths"]
    for path in (
        "/api/v1/dashboard/cluster/",
        "/api/v1/dashboard/cluster/series/",
        "/api/v1/dashboard/gpus/series/",
        "/api/v1/dashboard/jobs/series/",
        "/api/v1/dashboard/interference/",
        "/api/v1/gpus/{id}/series/",
        "/api/v1/jobs/{id}/series/",
        "/api/v1/jobs/{id}/log/",
    ):
        assert "get" in paths[path], path
    components = schema["components"]["schemas"]
    overview = components["ClusterOverview"]["properties"]
    assert overview["queue_length"]["type"] == "integer"
    assert overview["results"]["items"]["$ref"].endswith("/NodeLive")
    series = components["Series"]["properties"]
    assert series["v"]["items"]["type"] == "number"
    assert series["t"]["items"]["format"] == "date-time"
    log_ref = paths["/api/v1/jobs/{id}/log/"]["get"]["responses"]["200"]["content"]
    assert log_ref["application/json"]["schema"]["$ref"].endswith("/JobLog")
