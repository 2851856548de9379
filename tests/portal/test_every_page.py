"""Every page and view a user can reach is rendered by a test: this one walks the portal's URL
configuration (the browser side; the API has its own schema-driven fuzz test and the admin is
Django's), builds a path for every route from rows it creates, and GETs each as the job's owner
and as staff. A page must answer 200 with a heading; a view that only acts (cancel, revoke,
drain...) must refuse a GET with 405 and change nothing. A route added without an entry here
fails the test, so a new page cannot go unrendered (the Usage page's default view once answered
500 while every test passed)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from portal.core import jobcontrol
from portal.core.models import ApplicationProfile, Job, Node
from portal.core.nodes import node_token_create
from portal.core.services import job_submit
from portal.front.services import token_create
from portal.replay.models import ReplayRun

pytestmark = pytest.mark.django_db

#: route name -> (path template, kind): "page" answers GET with 200, "action" only takes POST
ROUTES = {
    "index": ("/", "page"),
    "login": ("/login/", "public"),
    "logout": ("/logout/", "action"),
    "jobs": ("/jobs/", "page"),
    "job_new": ("/jobs/new/", "page"),
    "job_detail": ("/jobs/{job}/", "page"),
    "job_cancel": ("/jobs/{job}/cancel/", "action"),
    "job_preempt": ("/jobs/{job}/preempt/", "action"),
    "job_edit": ("/jobs/{job}/edit/", "page"),
    "job_control": ("/jobs/{job}/hold/", "action"),
    "job_array": ("/jobs/array/{array}/", "page"),
    "profiles": ("/profiles/", "page"),
    "profile_detail": ("/profiles/{profile}/", "page"),
    "profile_profiling": ("/profiles/{profile}/profiling/", "action"),
    "cluster": ("/cluster/", "page"),
    "node_tokens": ("/cluster/node-tokens/", "staff"),
    "node_token_revoke": ("/cluster/node-tokens/{node_token}/revoke/", "action"),
    "node_operate": ("/cluster/nodes/{node}/drain/", "action"),
    "usage": ("/usage/", "page"),
    "account": ("/account/", "page"),
    "token_new": ("/account/tokens/", "action"),
    "token_revoke": ("/account/tokens/{token}/revoke/", "action"),
    "docs": ("/docs/", "public"),
    "docs_page": ("/docs/jobs/", "public"),
    "replay_list": ("/replay/", "staff"),
    "replay_detail": ("/replay/{replay}/", "staff"),
    "replay_status": ("/replay/{replay}/status/", "staff-json"),
    "replay_delete": ("/replay/{replay}/delete/", "action"),
    "replay_file": ("/replay/{replay}/files/summary.csv", "staff-file"),
    "healthz": ("/healthz", "public-text"),
    # a node agent's endpoints (its own token, POST only: tests/portal/test_agent_api*.py)
    "agent-sync": ("/agent/v1/sync", "action"),
    "agent-results": ("/agent/v1/results", "action"),
    # Prometheus scrapes with a token or from an allowed address (tests/portal/test_prometheus.py)
    "metrics": ("/metrics", "public-text"),
}

#: query strings a page is also rendered with (its filters and views); a bad value is
#: answered 400 with the page and the field's message (``BAD``)
VARIANTS = {
    "jobs": ["?state=RUNNING", "?q=train&page=2"],
    "profiles": ["?kind=dl-train&status=approved&q=res"],
    "usage": ["?by=user", "?by=job&since=7d", "?format=csv", "?by=model"],
    "cluster": ["?range=6h"],
}

BAD = {"/usage/?by=model": "must be one of project, user, job"}


def _front_routes() -> dict[str, str]:
    found: dict[str, str] = {}

    def walk(patterns, prefix: str) -> None:
        for p in patterns:
            if isinstance(p, URLResolver):
                route = prefix + str(p.pattern)
                if not route.startswith(("admin/", "api/")):
                    walk(p.url_patterns, route)
            elif isinstance(p, URLPattern) and p.name:
                route = prefix + str(p.pattern)
                if not route.startswith(("admin/", "api/")):
                    found[p.name] = route

    walk(get_resolver().url_patterns, "")
    return found


def test_every_front_route_is_listed_here():
    routes = _front_routes()
    missing = sorted(set(routes) - set(ROUTES))
    assert not missing, f"routes without a rendering test: {missing} (add them to ROUTES)"
    gone = sorted(set(ROUTES) - set(routes))
    assert not gone, f"ROUTES names routes that no longer exist: {gone}"


@pytest.fixture
def rows(alice, staff, tmp_path):
    profile = ApplicationProfile.objects.create(
        name="resnet", kind="dl-train", status="approved", created_by=staff
    )
    job, _ = job_submit(alice, name="train", command="python train.py", gpus=1, profile=profile)
    array, _ = job_submit(
        alice,
        name="sweep",
        command="echo $COSCHED_ARRAY_INDEX",
        array=jobcontrol.parse_array("0-3%2"),
    )
    node = Node.objects.create(name="n1", kind="gpu", cores=8, memory_mb=65536)
    node_token, _ = node_token_create("n1")
    token, _ = token_create(alice, name="ci")
    out = tmp_path / "replay"
    out.mkdir()
    (out / "summary.csv").write_text("policy,avg_jct_s\nfifo,10\n")
    now = timezone.now()
    replay = ReplayRun.objects.create(
        created_by=staff, since=now - timedelta(days=1), until=now, policies=["fifo"],
        status="done", progress=1.0, out_dir=str(out),
    )  # fmt: skip
    return {
        "replay": replay.pk,
        "job": job.pk,
        "array": array.pk,
        "profile": profile.pk,
        "node": node.pk,
        "node_token": node_token.pk,
        "token": token.pk,
    }


@pytest.fixture
def docs_site(settings, tmp_path):
    """A built docs site (``make docs`` writes the real one; a bare pytest run has none)."""
    site = tmp_path / "site"
    (site / "jobs").mkdir(parents=True)
    (site / "index.html").write_text("<h1>Cosched</h1>")
    (site / "jobs" / "index.html").write_text("<h1>Jobs</h1>")
    settings.DOCS_SITE_DIR = str(site)
    return site


def test_the_docs_pages_say_how_to_build_a_missing_site(client, settings, tmp_path):
    settings.DOCS_SITE_DIR = str(tmp_path / "none")
    response = client.get("/docs/")
    assert response.status_code == 503 and "make docs" in response.content.decode()


@pytest.mark.parametrize("who", ["alice", "staff"])
def test_every_page_renders_for_its_users(client, alice, staff, rows, docs_site, who):
    user = alice if who == "alice" else staff
    client.force_login(user)
    before = (Job.objects.filter(state="PENDING").count(), Node.objects.get().status)
    for name, (template, kind) in ROUTES.items():
        path = template.format(**rows)
        if kind == "action":
            assert client.get(path).status_code == 405, path
            continue
        if kind.startswith("staff") and who != "staff":
            assert client.get(path).status_code in (302, 403, 404), path
            continue
        if kind == "public":  # what a visitor sees, logged in or not
            assert Client().get(path).status_code == 200, path
            continue
        if kind in ("staff-json", "staff-file", "public-text"):
            response = client.get(path)
            assert response.status_code == 200, (path, response.status_code)
            continue
        for suffix in ["", *VARIANTS.get(name, [])]:
            response = client.get(path + suffix, follow=name == "index")
            if path + suffix in BAD:
                assert response.status_code == 400, path + suffix
                assert BAD[path + suffix] in response.content.decode()
                continue
            assert response.status_code == 200, (path + suffix, response.status_code)
            if "format=csv" not in suffix:
                assert "<h1" in response.content.decode(), path + suffix
    # nothing was done by a GET
    assert (Job.objects.filter(state="PENDING").count(), Node.objects.get().status) == before
