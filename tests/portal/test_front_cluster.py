"""The cluster page: nodes and GPUs, the GPU backend named as what it is, live values and
jobs (other users' jobs anonymous), down nodes, plot containers; the job page's live parts."""

from __future__ import annotations

import pytest

from portal.core.models import Gpu, Node

pytestmark = pytest.mark.django_db


def test_lists_nodes_and_their_gpus(client, alice):
    node = Node.objects.create(name="gpu-1", kind="gpu", cores=32, memory_mb=131072)
    Gpu.objects.create(
        node=node,
        index=0,
        model="A30",
        architecture="Ampere",
        memory_mb=24576,
        sm_count=56,
        sharing_modes=["exclusive", "mps", "mig"],
        mig_profiles=[{"name": "1g.6gb", "slices": 1, "memory_mb": 6144}],
    )
    Node.objects.create(name="cpu-1", kind="cpu", cores=64, status="down")
    client.force_login(alice)
    html = client.get("/cluster/").content.decode()
    assert "gpu-1" in html and "cpu-1" in html
    assert "A30" in html and "Ampere" in html and "24.0 GB" in html
    assert ">MPS<" in html and ">1g.6gb<" in html
    assert "GPU backend: virtual" in html
    assert "Down" in html
    assert "No GPUs: CPU jobs run here." in html


def test_an_empty_cluster_says_how_nodes_appear(client, alice):
    client.force_login(alice)
    assert "No nodes registered" in client.get("/cluster/").content.decode()


def _live_cluster(alice, bob):
    from django.utils import timezone

    from portal.core.metrics import Sample, metrics_record
    from portal.core.models import Job, Placement

    node = Node.objects.create(name="gpu-v", kind="gpu", cores=8, backend="virtual")
    gpu = Gpu.objects.create(node=node, index=0, model="V100", memory_mb=16384, current_mode="mps")
    Node.objects.create(name="gpu-gone", kind="gpu", status="down", backend="nvml")
    mine = Job.objects.create(owner=alice, name="alice-train", gpus=1, state="RUNNING")
    theirs = Job.objects.create(owner=bob, name="bob-secret", gpus=1, state="RUNNING")
    Job.objects.create(owner=bob, name="queued", gpus=1)
    for job in (mine, theirs):
        Placement.objects.create(job=job, node=node, sharing_mode="mps", policy="fifo").gpus.add(
            gpu
        )
    metrics_record([Sample("util_pct", 73.0, timezone.now(), gpu_id=gpu.pk)])
    return mine


@pytest.fixture
def _local_metrics(settings):
    from portal.core import metrics

    settings.REDIS_URL = ""
    metrics.metrics_store_clear()
    yield
    metrics.metrics_store_clear()


def test_dashboard_shows_live_values_jobs_and_down_nodes(client, alice, bob, _local_metrics):
    mine = _live_cluster(alice, bob)
    client.force_login(alice)
    html = client.get("/cluster/").content.decode()
    assert "virtual GPU (simulated)" in html
    assert 'id="stat-queue">1<' in html and 'id="stat-running">2<' in html
    assert 'id="down-nodes"' in html and "gpu-gone" in html and 'class="node-down"' in html
    assert "73%" in html
    assert f'href="/jobs/{mine.pk}/">#{mine.pk} alice-train</a>' in html
    assert "another user's job" in html and "bob-secret" not in html
    for plot in ("gpu-util", "gpu-memory", "job-slowdown", "sd-max-diff", "interference"):
        assert f'id="plot-{plot}" data-points="0"' in html
    assert "No metrics yet: no job has run" in html
    assert "/static/js/plotly.min.js" in html and "/static/js/dashboard.js" in html


def test_staff_see_every_job_on_the_dashboard(client, alice, bob, staff, _local_metrics):
    _live_cluster(alice, bob)
    client.force_login(staff)
    html = client.get("/cluster/").content.decode()
    assert "bob-secret" in html and "alice-train" in html
    assert "another user" not in html


def test_no_down_banner_and_no_scripts_without_nodes(client, alice):
    client.force_login(alice)
    html = client.get("/cluster/").content.decode()
    assert 'id="down-nodes" hidden' in html
    assert "plotly.min.js" not in html


def test_job_page_has_live_log_and_slowdown_plot(client, alice, bob):
    from portal.core.models import Job

    job = Job.objects.create(owner=alice, name="train", gpus=1)
    client.force_login(alice)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="plot-job-slowdown" data-points="0"' in html and 'id="job-log"' in html
    assert f'data-url-job-log="/api/v1/jobs/{job.pk}/log/"' in html
    assert 'id="job-state">PENDING<' in html
    assert "No metrics yet: the job has not run." in html
    client.force_login(bob)
    assert client.get(f"/jobs/{job.pk}/").status_code == 404


def test_plotly_is_served_from_our_static_files(client, alice):
    client.force_login(alice)
    response = client.get("/static/js/plotly.min.js")
    assert response.status_code == 200
    body = b"".join(response.streaming_content) if response.streaming else response.content
    assert b"plotly.js v" in body[:200]


# -- the queue ------------------------------------------------------------------------------------


@pytest.fixture
def queued(alice, bob):
    from portal.core.models import Job
    from portal.core.services import job_submit

    mine, _ = job_submit(alice, name="alice-train", command="run", gpus=0, cpus=2)
    theirs, _ = job_submit(bob, name="bob-secret-project", command="run", gpus=0, cpus=4)
    Job.objects.filter(pk=mine.pk).update(waiting_reason="needs 2 free cores; cpu-1 has 0")
    Job.objects.filter(pk=theirs.pk).update(waiting_reason="behind job ahead in FIFO order")
    return mine, theirs


def test_the_queue_shows_waiting_reasons_and_hides_other_users_jobs(client, alice, queued):
    mine, theirs = queued
    client.force_login(alice)
    html = client.get("/cluster/").content.decode()
    assert 'id="queue-count">2 pending<' in html
    assert f"#{mine.pk} alice-train" in html and "needs 2 free cores; cpu-1 has 0" in html
    assert "behind job ahead in FIFO order" in html and "another user's job" in html
    assert "bob-secret-project" not in html and "bob" not in html.split('id="queue"')[1][:4000]


def test_staff_see_every_queued_job_and_its_owner(client, staff, queued):
    client.force_login(staff)
    html = client.get("/cluster/").content.decode()
    assert "bob-secret-project" in html and "<th>Owner</th>" in html


def test_the_queue_api_hides_other_users_jobs(alice_api, staff_api, queued):
    mine, theirs = queued
    rows = alice_api.get("/api/v1/dashboard/queue/").json()["results"]
    assert [(r["position"], r["id"], r["name"], r["owner"]) for r in rows] == [
        (1, mine.pk, "alice-train", "alice"),
        (2, None, None, None),
    ]
    assert rows[1]["waiting_reason"] == "behind job ahead in FIFO order" and rows[1]["cpus"] == 4
    staff_rows = staff_api.get("/api/v1/dashboard/queue/?limit=1").json()
    assert staff_rows["count"] == 2 and len(staff_rows["results"]) == 1
    assert staff_rows["results"][0]["owner"] == "alice"


def test_the_plots_have_a_time_range(client, alice):
    Node.objects.create(name="cpu-1", kind="cpu", cores=4)
    client.force_login(alice)
    html = client.get("/cluster/?range=6h").content.decode()
    assert 'data-window-s="21600"' in html
    assert '<option value="6h" selected>6 hours</option>' in html
    assert 'data-window-s="3600"' in client.get("/cluster/?range=bogus").content.decode()


def test_an_invalid_active_policy_is_shown_with_its_error(client, alice, staff):
    from portal.core.models import PolicySettings

    PolicySettings.objects.create(name="bad", policy="binpack", params={"max_jobs_per_gpu": "lots"})
    client.force_login(alice)
    html = client.get("/cluster/").content.decode()
    assert "The active policy configuration “bad” is invalid" in html
    assert "must be a whole number" not in html  # details for staff
    client.force_login(staff)
    html = client.get("/cluster/").content.decode()
    assert "<code>max_jobs_per_gpu</code>: must be a whole number, got &#x27;lots&#x27;" in html


def test_a_valid_policy_is_named_without_alarm(client, alice):
    from portal.core.models import PolicySettings

    PolicySettings.objects.create(name="main", policy="placement_rate+exec_plan", params={})
    client.force_login(alice)
    html = client.get("/cluster/").content.decode()
    assert "Policy in force:" in html and "<code>placement_rate+exec_plan</code>" in html
    assert 'id="policy-error"' not in html
