"""Every endpoint against the probe's inputs (issue 29, part 3): NUL characters, huge integers,
huge durations, 10,000-deep JSON, ``page_size=null`` and invalid pages. No answer is a 500:
a bad query parameter is a 400 naming it, a deep body a 400 (JSON, also on the agents' and the
training SDK's endpoints).

The operations come from the OpenAPI schema itself (so a new endpoint is fuzzed without a
change here), plus the endpoints outside it (agents, training SDK) and the browser pages.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from portal.core.models import (
    ApplicationProfile,
    Gpu,
    Job,
    Node,
    Placement,
    PlacementPart,
)
from portal.core.nodes import node_token_create
from portal.core.services import job_submit
from portal.core.training import job_token
from portal.front.services import token_create

pytestmark = pytest.mark.django_db

NUL = "a\x00b"
HUGE_INT = str(2**63)
HUGE_DURATION = "1000000000d"
DEEP = "[" * 10_000 + "]" * 10_000
DEEP_OBJECT = '{"a":' * 10_000 + "1" + "}" * 10_000
QUERY_VALUES = [NUL, HUGE_INT, "-" + HUGE_INT, HUGE_DURATION, "99999999999w", "null", "1e999"]


@pytest.fixture
def world(staff, monkeypatch):
    from rest_framework.throttling import SimpleRateThrottle

    monkeypatch.setattr(
        SimpleRateThrottle,
        "THROTTLE_RATES",
        {"anon": "100000/min", "user": "100000/min", "token": "100000/min", "job": "100000/min"},
    )
    node = Node.objects.create(name="gpu-1", kind="gpu", cores=16, memory_mb=65536)
    gpu = Gpu.objects.create(node=node, index=0, model="V100", memory_mb=16384)
    Node.objects.create(name="cpu-1", kind="cpu", cores=8, memory_mb=32768)
    profile = ApplicationProfile.objects.create(name="LAMMPS", kind="hpc", status="approved")
    queued, _ = job_submit(staff, name="seed", command="true")
    running = Job.objects.create(
        owner=staff, name="r", command="train", gpus=1, state="RUNNING", started_at=timezone.now()
    )
    placement = Placement.objects.create(job=running, attempt=1, node=node, policy="test")
    PlacementPart.objects.create(placement=placement, node=node, gpu_indices=[0], cpus=1)
    placement.gpus.add(gpu)
    _, key = token_create(staff, name="probe")
    _, node_key = node_token_create("gpu-1")
    return {
        "key": key,
        "node_key": node_key,
        "job_token": job_token(running.pk, 1),
        "ids": {"job": queued.pk, "profile": profile.pk, "node": node.pk, "gpu": gpu.pk},
    }


def _schema(client: Client) -> dict[str, Any]:
    response = client.get("/api/schema/?format=json")
    assert response.status_code == 200
    return response.json()


def _concrete(path: str, ids: dict[str, int]) -> str:
    kind = "job"
    for name in ("profile", "node", "gpu"):
        if f"/{name}s/" in path:
            kind = name
    return re.sub(r"\{[^}]+\}", str(ids[kind]), path)


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, op)
        for path, item in schema["paths"].items()
        for method, op in item.items()
        if method in {"get", "post", "put", "patch", "delete"}
    ]


def _body_fields(schema: dict[str, Any], op: dict[str, Any]) -> list[str]:
    content = op.get("requestBody", {}).get("content", {}).get("application/json", {})
    ref = content.get("schema", {}).get("$ref", "")
    if not ref:
        return []
    return list(schema["components"]["schemas"][ref.rsplit("/", 1)[1]].get("properties", {}))


def test_every_api_operation_answers_the_probe_without_a_500(world):
    client = Client(HTTP_AUTHORIZATION=f"Token {world['key']}")
    schema = _schema(client)
    operations = _operations(schema)
    assert len(operations) > 20
    failures: list[str] = []
    tried = 0

    def check(method: str, url: str, response: Any, what: str) -> None:
        nonlocal tried
        tried += 1
        if response.status_code >= 500:
            failures.append(f"{method.upper()} {url} {what}: {response.status_code}")

    for path, method, op in operations:
        url = _concrete(path, world["ids"])
        if method == "delete":
            url = re.sub(r"/\d+/", "/999999/", url)
        params = [p["name"] for p in op.get("parameters", []) if p["in"] == "query"]
        if method == "get" and "page" in params:
            params.append("page_size") if "page_size" not in params else None
        for name in params or ["page"]:
            for value in QUERY_VALUES:
                response = getattr(client, method)(f"{url}?{name}={_q(value)}")
                check(method, url, response, f"{name}={value[:20]!r}")
                if value == NUL:
                    assert response.status_code == 400, (url, name, response.content)
                    assert name in response.content.decode(), (url, name, response.content)
        if method in {"post", "put", "patch"}:
            fields = _body_fields(schema, op)
            for body in (DEEP, DEEP_OBJECT):
                response = getattr(client, method)(url, body, content_type="application/json")
                check(method, url, response, "deep JSON")
                if fields:  # an operation that reads its body refuses it
                    assert response.status_code in {400, 413}, (url, response.content)
            for field in fields:
                for value in (2**31, 2**63, -(2**63), 1e308, NUL, HUGE_DURATION):
                    body = json.dumps({field: value})
                    response = getattr(client, method)(url, body, content_type="application/json")
                    check(method, url, response, f"{field}={value!r}")
    assert tried > 500
    assert not failures, "\n".join(failures)


def _q(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="")


@pytest.mark.parametrize("url", ["/agent/v1/sync", "/agent/v1/results"])
@pytest.mark.parametrize("body", [DEEP, DEEP_OBJECT])
def test_the_agent_endpoints_answer_deep_json_with_a_json_400(world, url, body):
    response = Client().post(
        url, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {world['node_key']}"
    )
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert "nested" in response.json()["error"]


@pytest.mark.parametrize("url", ["/api/v1/training/report/", "/api/v1/training/elastic/"])
@pytest.mark.parametrize("body", [DEEP, DEEP_OBJECT])
def test_the_training_endpoints_answer_deep_json_with_a_400(world, url, body):
    response = Client().post(
        url,
        body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {world['job_token']}",
    )
    assert response.status_code == 400, response.content
    assert "nested" in json.dumps(response.json())


@pytest.mark.parametrize("field", ["epoch", "iteration", "iterations_total"])
def test_a_training_report_count_past_the_database_column_is_a_400(world, field):
    body = {"iteration": 1, field: 2**31}
    response = Client().post(
        "/api/v1/training/report/",
        json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {world['job_token']}",
    )
    assert response.status_code == 400, response.content
    assert "2,147,483,647" in response.json()["errors"][field]


PAGES = ["/jobs/", "/jobs/new/", "/profiles/", "/cluster/", "/usage/", "/account/", "/replay/"]


@pytest.mark.parametrize("page", PAGES)
def test_browser_pages_answer_the_probe_without_a_500(world, staff, page):
    client = Client()
    client.force_login(staff)
    for name in ("search", "q", "name", "state", "status", "since", "until", "by", "page"):
        for value in QUERY_VALUES:
            response = client.get(f"{page}?{name}={_q(value)}")
            assert response.status_code < 500, (page, name, value)
            if value == NUL:
                assert response.status_code == 400
                assert name in response.content.decode()


def test_the_admin_policy_form_refuses_deep_json_as_a_field_error(client, staff):
    from portal.core.models import PolicySettings
    from tests.portal.test_policy_settings import ADD, _form

    client.force_login(staff)
    response = client.post(ADD, _form("binpack", weights=DEEP))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors["param__weights"]
    assert any("nested 10000 levels deep" in e for e in errors), errors
    assert not PolicySettings.objects.filter(name="main").exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("workers", 2**63),
        ("batches", 2**63),
        ("seconds", 1e308),
        ("remaining_steps", 2**80),
        ("elapsed_s", 10**12),
        ("local_batch", 2**31),
    ],
)
def test_an_elastic_window_with_a_huge_number_is_a_400_naming_it(world, field, value):
    body = {"workers": 1, "batches": 10, "seconds": 1.0, field: value}
    response = Client().post(
        "/api/v1/training/elastic/",
        json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {world['job_token']}",
    )
    assert response.status_code == 400, response.content
    assert list(response.json()["errors"]) == [field]


@pytest.mark.parametrize(
    "url", ["/api/v1/jobs/", "/api/v1/profiles/", "/api/v1/nodes/", "/api/v1/dashboard/cluster/"]
)
def test_page_size_and_page_are_checked(world, url):
    client = Client(HTTP_AUTHORIZATION=f"Token {world['key']}")
    for bad in ("null", "0", "501", "-1", "1.5", "", "\u0661"):
        response = client.get(url, {"page_size": bad})
        assert response.status_code == 400, (bad, response.content)
        assert "page_size" in response.json()
    assert client.get(url, {"page_size": "500"}).status_code == 200
    for bad in ("abc", "", "99999999999999999999", "0"):
        response = client.get(url, {"page": bad})
        assert response.status_code == 404, (bad, response.content)
        assert response.json() == {"detail": "Invalid page."}
