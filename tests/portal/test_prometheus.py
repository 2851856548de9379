"""Prometheus /metrics: scraped like Prometheus does, parsed with its own text parser, every value
compared with the rows it comes from; access control; the Grafana dashboard's expressions."""

from __future__ import annotations

import json
import os
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from portal.core import metrics, prometheus
from portal.core.metrics import Sample, metrics_record
from portal.core.models import Gpu, Job, Node, Placement
from portal.core.scheduling import run_cycle

pytestmark = pytest.mark.django_db

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "cosched.json"


@pytest.fixture(params=["local", "redis"])
def store(request, settings):
    """The live store and the latency counters: process-local, and in the real Redis."""
    settings.REDIS_URL = REDIS_URL if request.param == "redis" else ""
    metrics.metrics_store_clear()
    prometheus.decision_latency_clear()
    yield request.param
    metrics.metrics_store_clear()
    prometheus.decision_latency_clear()


def scrape(client, **extra) -> dict[str, list]:
    """GET /metrics -> {sample name: [(labels, value), ...]} through Prometheus' parser."""
    response = client.get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def value(samples: dict[str, list], name: str, **labels: str) -> float:
    found = [
        v for got, v in samples.get(name, []) if all(got.get(k) == x for k, x in labels.items())
    ]
    assert len(found) == 1, f"{name}{labels}: {found} in {samples.get(name)}"
    return found[0]


def make_cluster():
    now = timezone.now()
    gpu_node = Node.objects.create(
        name="gpu-1",
        kind="gpu",
        cores=8,
        last_heartbeat=now - timedelta(seconds=42),
        lease_expires_at=now + timedelta(seconds=10),
    )
    Node.objects.create(name="cpu-1", kind="cpu", cores=4, status="down")
    gpus = [
        Gpu.objects.create(
            node=gpu_node, index=i, model="TitanXp", memory_mb=12288, uuid=f"GPU-test-{i}"
        )
        for i in range(2)
    ]
    return gpu_node, gpus


def test_scrape_matches_the_database(client, alice, bob, store):
    node, gpus = make_cluster()
    now = timezone.now()
    running = [
        Job.objects.create(owner=who, name=f"train-{i}", gpus=1, state="RUNNING")
        for i, who in enumerate([alice, bob])
    ]
    pending = [Job.objects.create(owner=alice, name=f"q{i}", gpus=1) for i in range(3)]
    Job.objects.create(owner=alice, name="done", state="COMPLETED")
    Job.objects.create(owner=bob, name="broke", state="FAILED")
    # Submission and start times: waits of 10 s and 100 s for the two started jobs; the pending
    # jobs have waited 100, 200 and 300 s.
    for job, wait in zip(running, (10, 100), strict=True):
        Job.objects.filter(pk=job.pk).update(
            submitted_at=now - timedelta(seconds=1000),
            started_at=now - timedelta(seconds=1000 - wait),
        )
    for job, age in zip(pending, (100, 200, 300), strict=True):
        Job.objects.filter(pk=job.pk).update(submitted_at=now - timedelta(seconds=age))
    placement = Placement.objects.create(job=running[0], node=node, policy="t", gpu_memory_mb=4000)
    placement.gpus.set([gpus[0]])
    Job.objects.filter(pk=running[1].pk).update(state="PAUSED")

    metrics_record(
        [
            Sample("util_pct", 37.5, now, gpu_id=gpus[0].pk, node_id=node.pk),
            Sample("memory_used_mb", 4096.0, now, gpu_id=gpus[0].pk, node_id=node.pk),
            Sample("memory_total_mb", 12288.0, now, gpu_id=gpus[0].pk, node_id=node.pk),
            # an old reading of GPU 1: stale, not exported
            Sample("util_pct", 99.0, now - timedelta(hours=1), gpu_id=gpus[1].pk),
            Sample("slowdown", 1.25, now, job_id=running[0].pk),
            Sample("slowdown", 1.75, now, job_id=running[1].pk),
        ]
    )

    s = scrape(client)

    assert value(s, "cosched_jobs", state="running") == 1
    assert value(s, "cosched_jobs", state="paused") == 1
    assert value(s, "cosched_jobs", state="pending") == 3
    assert value(s, "cosched_jobs", state="completed") == 1
    assert value(s, "cosched_jobs", state="failed") == 1
    assert value(s, "cosched_jobs", state="cancelled") == 0
    assert value(s, "cosched_queue_length") == 3
    assert value(s, "cosched_queue_oldest_wait_seconds") == pytest.approx(300, abs=5)
    assert value(s, "cosched_queue_mean_wait_seconds") == pytest.approx(200, abs=5)
    # queueing delay of the started jobs: 10 s and 100 s
    assert value(s, "cosched_job_wait_seconds_count") == 2
    assert value(s, "cosched_job_wait_seconds_sum") == pytest.approx(110)
    assert value(s, "cosched_job_wait_seconds_bucket", le="5.0") == 0
    assert value(s, "cosched_job_wait_seconds_bucket", le="15.0") == 1
    assert value(s, "cosched_job_wait_seconds_bucket", le="300.0") == 2

    assert value(s, "DCGM_FI_DEV_GPU_UTIL", node="gpu-1", gpu="0", UUID="GPU-test-0") == 37.5
    assert value(s, "DCGM_FI_DEV_FB_USED", node="gpu-1", gpu="0", modelName="TitanXp") == 4096
    assert value(s, "DCGM_FI_DEV_FB_FREE", node="gpu-1", gpu="0") == 12288 - 4096
    assert not [v for labels, v in s["DCGM_FI_DEV_GPU_UTIL"] if labels["gpu"] == "1"]
    assert value(s, "cosched_gpu_jobs", node="gpu-1", gpu="0") == 1
    assert value(s, "cosched_gpu_jobs", node="gpu-1", gpu="1") == 0

    assert value(s, "cosched_job_slowdown", job_id=str(running[0].pk), user="alice") == 1.25
    assert value(s, "cosched_job_slowdown", job_id=str(running[1].pk), state="paused") == 1.75
    assert value(s, "cosched_slowdown_max_diff") == pytest.approx(0.5)
    assert "job" not in {k for labels, _ in s["cosched_job_slowdown"] for k in labels}

    assert value(s, "cosched_node_heartbeat_age_seconds", node="gpu-1") == pytest.approx(42, abs=5)
    assert "cpu-1" not in {labels["node"] for labels, _ in s["cosched_node_heartbeat_age_seconds"]}
    assert value(s, "cosched_node_up", node="gpu-1") == 1
    assert value(s, "cosched_node_up", node="cpu-1", status="down") == 0
    assert value(s, "cosched_node_lease_remaining_seconds", node="gpu-1") == pytest.approx(
        10, abs=5
    )


def test_decision_latency_counts_every_cycle(client, alice, store, settings):
    from portal.core.models import PolicySettings

    settings.REDIS_URL = REDIS_URL if store == "redis" else ""
    make_cluster()
    PolicySettings.objects.create(name="t", policy="fifo", params={}, active=True)
    for i in range(3):
        Job.objects.create(owner=alice, name=f"j{i}", gpus=1, gpu_memory_mb=1000, command="true")
    results = [run_cycle(seed=0) for _ in range(2)]

    s = scrape(client)
    assert value(s, "cosched_decision_latency_seconds_count") == 2
    assert value(s, "cosched_decision_latency_seconds_sum") == pytest.approx(
        sum(r.policy_seconds for r in results)
    )
    assert value(s, "cosched_decision_latency_seconds_bucket", le="+Inf") == 2
    assert value(s, "cosched_cycle_duration_seconds_count") == 2
    assert value(s, "cosched_cycle_duration_seconds_sum") == pytest.approx(
        sum(r.seconds for r in results)
    )
    slowest = max(r.policy_seconds for r in results)
    first_holding_all = min(b for b in prometheus.DECISION_BUCKETS_S if b >= slowest)
    assert value(s, "cosched_decision_latency_seconds_bucket", le=repr(first_holding_all)) == 2


def test_a_dead_redis_neither_fails_the_cycle_nor_the_scrape(client, alice, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    prometheus._pause_until = 0.0
    make_cluster()
    Job.objects.create(owner=alice, name="j", gpus=1, gpu_memory_mb=1000, command="true")
    result = run_cycle(seed=0)
    assert result.placed
    settings.REDIS_URL = ""
    prometheus.decision_latency_clear()
    s = scrape(client)
    assert value(s, "cosched_jobs", state="scheduled") == 1


def test_other_addresses_need_the_token(client, settings):
    settings.COSCHED = {**settings.COSCHED, "METRICS_TOKEN": "", "METRICS_ALLOWED_NETWORKS": []}
    assert client.get("/metrics").status_code == 403  # not even loopback now

    settings.COSCHED = {**settings.COSCHED, "METRICS_TOKEN": "s3cret-scrape-token"}
    far = {"REMOTE_ADDR": "10.1.2.3"}
    assert client.get("/metrics", **far).status_code == 401
    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope", **far)
    assert wrong.status_code == 401 and wrong["WWW-Authenticate"].startswith("Bearer")
    scrape(client, HTTP_AUTHORIZATION="Bearer s3cret-scrape-token", **far)

    settings.COSCHED = {**settings.COSCHED, "METRICS_ALLOWED_NETWORKS": ["10.1.0.0/16"]}
    scrape(client, **far)
    assert client.get("/metrics", REMOTE_ADDR="10.2.0.1").status_code == 401
    assert client.post("/metrics", **far).status_code == 405


def test_loopback_is_allowed_by_default(client, settings):
    assert "127.0.0.0/8" in settings.COSCHED["METRICS_ALLOWED_NETWORKS"]
    scrape(client)
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7").status_code == 403


# --- the Grafana dashboard ------------------------------------------------------------------------

_PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "offset",
    "bool",
}


def metric_names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (label matchers, grouping clauses, ranges,
    strings and function names removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        rest = text[match.end() :].lstrip()
        if word in _PROMQL_WORDS or rest.startswith("("):
            continue
        names.add(word)
    return names


def test_metric_names_in_reads_promql():
    expr = 'histogram_quantile(0.99, sum by (le) (rate(cosched_x_bucket{a="b"}[5m]))) / up'
    assert metric_names_in(expr) == {"cosched_x_bucket", "up"}


def panels_of(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def test_the_grafana_dashboard_reads_only_exposed_metrics(client, alice, store):
    node, gpus = make_cluster()
    now = timezone.now()
    job = Job.objects.create(owner=alice, name="t", gpus=1, state="RUNNING", started_at=now)
    metrics_record(
        [
            Sample("util_pct", 50.0, now, gpu_id=gpus[0].pk),
            Sample("memory_used_mb", 100.0, now, gpu_id=gpus[0].pk),
            Sample("slowdown", 1.1, now, job_id=job.pk),
        ]
    )
    exposed = set(scrape(client))

    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"]
    graphs = [p for p in panels_of(dashboard) if p.get("type") != "row"]
    assert len(graphs) >= 8
    read: set[str] = set()
    for panel in graphs:
        exprs = [t["expr"] for t in panel.get("targets", [])]
        assert exprs, f"panel {panel['title']!r} has no query"
        for expr in exprs:
            names = metric_names_in(expr)
            assert names, f"panel {panel['title']!r}: no metric in {expr!r}"
            missing = names - exposed
            assert not missing, f"panel {panel['title']!r} reads {missing}, not exposed"
            read |= names
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "cosched_jobs"} <= read
    assert "cosched_decision_latency_seconds_bucket" in read


def test_the_dashboard_lays_its_panels_out_without_overlap():
    dashboard = json.loads(DASHBOARD.read_text())
    panels = panels_of(dashboard)
    assert len({p["id"] for p in panels}) == len(panels)
    boxes = []
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        boxes.append((g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"], p["title"]))
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            overlap = a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
            assert not overlap, f"{a[4]!r} overlaps {b[4]!r}"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for p in panels:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and "datasource" in variables


def test_per_job_gpu_series_carry_the_newest_reading_labelled_job_id(client, alice, store):
    from portal.core.models import GpuReading

    node, _ = make_cluster()
    running = [
        Job.objects.create(owner=alice, name=f"train-{i}", gpus=1, state=state)
        for i, state in enumerate(["RUNNING", "PAUSED"])
    ]
    now = timezone.now()
    for at, mb, util in ((now - timedelta(seconds=20), 1000.0, 30.0), (now, 3000.0, 80.0)):
        GpuReading.objects.create(
            job=running[0], attempt=1, node=node, gpu_index=0, at=at, memory_mb=mb, util_pct=util
        )
    # a reading of an hour ago is no current series
    GpuReading.objects.create(
        job=running[1],
        attempt=1,
        node=node,
        gpu_index=1,
        at=now - timedelta(hours=1),
        memory_mb=500.0,
    )
    s = scrape(client)
    labels = {"job_id": str(running[0].pk), "node": "gpu-1", "gpu": "0", "user": "alice"}
    assert value(s, "cosched_job_gpu_memory_mb", **labels) == 3000.0
    assert value(s, "cosched_job_gpu_util_pct", **labels) == 80.0
    assert [lab["job_id"] for lab, _ in s["cosched_job_gpu_memory_mb"]] == [str(running[0].pk)]
