"""Accounting from attempt records: GPU-seconds by model, CPU-seconds and wait per job, user and
project; the usage API (JSON and CSV), the usage page, the account page's fair share, and the
``cosched usage`` command against a live server."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from portal.core.models import Gpu, Job, Node, Placement, PlacementPart
from portal.core.services import job_submit
from portal.front.services import token_create
from portal.teams.accounting import usage_records, usage_totals
from portal.teams.models import Membership, Project
from tests.portal.test_cli import run_cli

pytestmark = pytest.mark.django_db

H = 3600.0


@pytest.fixture
def carol(django_user_model):
    return django_user_model.objects.create_user("carol", "carol@example.org", "carol-pass-123")


@pytest.fixture
def history(alice, bob):
    """Jobs with known attempts, all within the last day (``now`` is fixed by the fixture):

    - a1 (alice, lab): submitted -5h, 2 V100 from -4h50 to -3h50: 7200 V100-s, 4 cores x 1h,
      wait 600 s;
    - a2 (alice, lab): submitted -3h, 1 TitanXp -2h..-1h (requeued), then -30min..-10min and
      completed: 4800 TitanXp-s, wait 3600 + 1800 = 5400 s;
    - b1 (bob, personal): CPU only, 8 cores from -2h to -1h: 28800 core-s, wait 0;
    - b2 (bob, lab): still pending, submitted -20min: wait 1200 s so far.
    """
    now = timezone.now()
    lab = Project.objects.create(name="lab")
    Membership.objects.create(project=lab, user=alice)
    Membership.objects.create(project=lab, user=bob)
    v = Node.objects.create(name="v", kind="gpu", cores=16, memory_mb=1)
    t = Node.objects.create(name="t", kind="gpu", cores=16, memory_mb=1)
    c = Node.objects.create(name="c", kind="cpu", cores=16, memory_mb=1)
    v100 = [Gpu.objects.create(node=v, index=i, model="V100", memory_mb=16384) for i in range(2)]
    titan = Gpu.objects.create(node=t, index=0, model="TitanXp", memory_mb=12288)

    def job(user, name, project, submitted_h, state, finished_h=None, gpus=0):
        j = job_submit(user, name=name, command="true", gpus=gpus, project=project)[0]
        Job.objects.filter(pk=j.pk).update(
            submitted_at=now - timedelta(hours=submitted_h),
            state=state,
            finished_at=None if finished_h is None else now - timedelta(hours=finished_h),
        )
        return j

    def attempt(j, node, gpus, cpus, start_h, end_h, n):
        p = Placement.objects.create(
            job=j,
            attempt=n,
            node=node,
            cpus=cpus,
            policy="t",
            active=False,
            started_at=now - timedelta(hours=start_h),
            released_at=now - timedelta(hours=end_h),
        )
        p.gpus.set(gpus)
        PlacementPart.objects.create(placement=p, node=node, cpus=cpus)

    a1 = job(alice, "a1", "lab", 5, "COMPLETED", finished_h=3 + 50 / 60, gpus=2)
    attempt(a1, v, v100, 4, 4 + 50 / 60, 3 + 50 / 60, 1)
    a2 = job(alice, "a2", "lab", 3, "COMPLETED", finished_h=10 / 60, gpus=1)
    attempt(a2, t, [titan], 1, 2, 1, 1)
    attempt(a2, t, [titan], 1, 0.5, 10 / 60, 2)
    b1 = job(bob, "b1", None, 2, "COMPLETED", finished_h=1)
    attempt(b1, c, [], 8, 2, 1, 1)
    b2 = job(bob, "b2", "lab", 20 / 60, "PENDING")
    return {"now": now, "a1": a1, "a2": a2, "b1": b1, "b2": b2, "lab": lab}


def _records(since_h=24):
    now = timezone.now()
    return usage_records(
        Job.objects.all(), since=now - timedelta(hours=since_h), until=None, now=now
    )


def test_job_records_follow_the_attempts(history):
    recs = {r.name: r for r in _records()}
    assert recs["a1"].gpu_seconds_by_model == {"V100": pytest.approx(2 * H)}
    assert recs["a1"].cpu_seconds == pytest.approx(4 * H)
    assert recs["a1"].wait_seconds == pytest.approx(600, abs=2)
    assert recs["a2"].gpu_seconds_by_model == {"TitanXp": pytest.approx(H + 20 * 60)}
    assert recs["a2"].attempts == 2
    assert recs["a2"].wait_seconds == pytest.approx(H + 30 * 60, abs=2)
    assert recs["b1"].gpu_seconds == 0 and recs["b1"].cpu_seconds == pytest.approx(8 * H)
    assert recs["b1"].project == "bob"  # bob's personal project
    assert recs["b2"].gpu_seconds == 0 and recs["b2"].wait_seconds == pytest.approx(1200, abs=5)


@pytest.mark.parametrize("by", ["project", "user", "job"])
def test_usage_totals_equal_the_sum_of_job_records(history, by):
    records = _records()
    rows = usage_totals(records, by)
    key = {"project": "project", "user": "user", "job": "job_id"}[by]
    for row in rows:
        mine = [r for r in records if str(getattr(r, key)) == str(row[by])]
        assert row["jobs"] == len(mine)
        assert row["gpu_seconds"] == pytest.approx(sum(r.gpu_seconds for r in mine))
        assert row["cpu_seconds"] == pytest.approx(sum(r.cpu_seconds for r in mine))
        assert row["wait_seconds"] == pytest.approx(sum(r.wait_seconds for r in mine))
    assert sum(r["gpu_seconds"] for r in rows) == pytest.approx(2 * H + H + 20 * 60)
    assert sum(r["jobs"] for r in rows) == 4


def test_a_window_counts_only_the_attempt_time_inside_it(history):
    recs = {r.name: r for r in _records(since_h=1.5)}
    # a1 ran before the window and was submitted before it: not in the report
    assert "a1" not in recs
    # a2: 30 min of its first attempt (-1.5h..-1h) and all 20 min of its second
    assert recs["a2"].gpu_seconds == pytest.approx(50 * 60, abs=2)
    assert recs["b1"].cpu_seconds == pytest.approx(8 * 30 * 60, abs=20)


def test_usage_api_json_csv_and_errors(history, alice, carol):
    api = APIClient()
    api.force_authenticate(alice)
    body = api.get("/api/v1/usage/", {"since": "1d", "by": "project"}).json()
    rows = {r["group"]: r for r in body["rows"]}
    # alice sees her jobs and lab's (bob's b2); not bob's personal b1
    assert set(rows) == {"lab"}
    assert rows["lab"]["jobs"] == 3
    assert rows["lab"]["gpu_seconds_by_model"] == {
        "TitanXp": pytest.approx(H + 20 * 60, abs=1),
        "V100": pytest.approx(2 * H, abs=1),
    }
    assert body["total"]["gpu_seconds"] == pytest.approx(rows["lab"]["gpu_seconds"])

    response = api.get("/api/v1/usage/", {"since": "1d", "by": "user", "format": "csv"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(response.content.decode())))
    by_user = {row["user"]: row for row in table}
    assert set(by_user) == {"alice", "bob"}
    assert float(by_user["alice"]["gpu_seconds_V100"]) == pytest.approx(2 * H, abs=1)

    bad = api.get("/api/v1/usage/", {"since": "yesterday", "by": "team"})
    assert bad.status_code == 400
    assert set(bad.json()) == {"since", "by"}

    outsider = APIClient()
    outsider.force_authenticate(carol)
    assert outsider.get("/api/v1/usage/", {"since": "1d"}).json()["rows"] == []


def test_usage_page_plots_and_exports(history, client, alice):
    client.force_login(alice)
    page = client.get("/usage/", {"since": "1d", "by": "user"})
    assert page.status_code == 200
    html = page.content.decode()
    assert "js/plotly.min.js" in html and "js/usage.js" in html
    figure = json.loads(re.search(r'id="usage-figure-data"[^>]*>(.*?)</script>', html, re.S)[1])
    names = [trace["name"] for trace in figure["data"]]
    assert "V100 GPU-hours" in names and "TitanXp GPU-hours" in names
    v100 = next(t for t in figure["data"] if t["name"] == "V100 GPU-hours")
    assert dict(zip(v100["x"], v100["y"], strict=True))["alice"] == pytest.approx(2.0)
    exported = client.get("/usage/", {"since": "1d", "by": "project", "format": "csv"})
    assert exported["Content-Type"].startswith("text/csv")
    assert exported.content.decode().splitlines()[1].startswith("lab,3,")
    assert client.get("/usage/", {"since": "nonsense"}).status_code == 400


def test_account_page_shows_fair_share(history, client, alice, bob):
    client.force_login(alice)
    html = client.get("/account/").content.decode()
    assert "Projects and fair share" in html and "lab" in html
    client.force_login(bob)
    assert "lab" in client.get("/account/").content.decode()


@pytest.mark.django_db(transaction=True)
def test_cosched_usage_against_a_live_server(live_server, history, alice):
    _, key = token_create(alice, name="ci")
    result = run_cli("usage", "--since", "1d", "--by", "project", url=live_server.url, token=key)
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[1].split()[:3] == ["PROJECT", "JOBS", "GPU-H"]
    lab = next(line.split() for line in lines if line.startswith("lab"))
    assert lab[1] == "3" and lab[2] == f"{(3 * H + 20 * 60) / H:.2f}"
    assert any(line.startswith("TOTAL") for line in lines)
    as_csv = run_cli(
        "usage", "--since", "1d", "--by", "user", "--csv", url=live_server.url, token=key
    )
    assert as_csv.code == 0
    rows = list(csv.DictReader(io.StringIO(as_csv.out)))
    assert {r["user"] for r in rows} == {"alice", "bob"}
    bad = run_cli("usage", "--since", "soon", url=live_server.url, token=key)
    assert bad.code == 2
    assert "the server rejected the options:\n  since: 'soon' is not a date" in bad.err
    projects = run_cli("projects", url=live_server.url, token=key)
    assert projects.code == 0, projects.err
    assert re.search(r"^lab\s+member\s+-\s+3\.\d\d\s+0\.\d{3}$", projects.out, re.M), projects.out
    status = run_cli("status", str(history["a1"].pk), url=live_server.url, token=key)
    assert re.search(r"^project\s+lab$", status.out, re.M), status.out


def test_my_projects_lists_role_quotas_in_use_and_fair_share(history, alice, bob):
    from portal.teams.models import ProjectQuota

    lab = history["lab"]
    ProjectQuota.objects.create(
        project=lab, gpu_model="V100", guaranteed_gpus=1, borrow_limit_gpus=None
    )
    # b2 (lab) now holds one V100
    p = Placement.objects.create(job=history["b2"], node=Node.objects.get(name="v"), policy="t")
    p.gpus.set([Gpu.objects.get(node__name="v", index=0)])
    api = APIClient()
    api.force_authenticate(alice)
    rows = {r["project"]: r for r in api.get("/api/v1/projects/").json()}
    assert set(rows) == {"lab"}  # alice has no personal project: all her jobs went to lab
    lab_row = rows["lab"]
    assert lab_row["role"] == "member" and lab_row["is_default"] is False
    assert lab_row["quotas"] == [
        {"gpu_model": "V100", "guaranteed_gpus": 1, "borrow_limit_gpus": None, "in_use_gpus": 1}
    ]
    # alice used 2 V100-hours 4-5 hours ago and 1.33 TitanXp-hours lately: barely decayed
    assert 3.0 < lab_row["my_usage_gpu_hours"] <= 3.34
    api.force_authenticate(bob)
    bob_rows = {r["project"]: r for r in api.get("/api/v1/projects/").json()}
    assert set(bob_rows) == {"lab", "bob"} and bob_rows["bob"]["personal"] is True
    # bob used nothing on GPUs: in lab he has the larger factor of the two
    assert bob_rows["lab"]["factor"] > lab_row["factor"]
