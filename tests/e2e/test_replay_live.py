"""What-if replay end to end: a staff member logs in to the portal (gunicorn), asks for a replay
of a period of finished jobs on the replay page, a real Celery worker runs it (the stack of
tests/e2e/conftest.py: PostgreSQL, Redis, two scheduler workers, beat), the page's status
endpoint reports progress until it is done, and the comparison and the simulator's report are
there. Nothing is eager: the task goes through the Redis broker."""

from __future__ import annotations

import re

import pytest
import requests

from tests.e2e.conftest import wait_for
from tests.portal.replay_helpers import finished_job, make_nodes, make_profile

pytestmark = [pytest.mark.django_db, pytest.mark.e2e]

JOBS = 40


@pytest.fixture(scope="module")
def history(stack, db_access):
    """40 completed jobs of two users on a 2-GPU node, committed for the stack's processes."""
    from django.contrib.auth import get_user_model

    users = get_user_model().objects
    staff = users.create_user("e2e-staff", "s@example.org", "staff-pass-123", is_staff=True)
    owners = [users.create_user(n, f"{n}@example.org", "user-pass-123") for n in ("ana", "ben")]
    nodes = make_nodes()
    profile = make_profile("ResNet-e2e", TitanXp=300.0)
    for i in range(JOBS):
        finished_job(
            owners[i % 2],
            name=f"h{i}",
            submitted_s=20 * i,
            wait_s=i % 7,
            run_s=290,
            node=nodes["titan"],
            profile=profile,
        )
    return staff


def logged_in(stack, username: str, password: str) -> requests.Session:
    session = requests.Session()
    session.get(f"{stack.url}/login/", timeout=30)
    response = session.post(
        f"{stack.url}/login/",
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
        },
        headers={"Referer": f"{stack.url}/login/"},
        timeout=30,
    )
    assert response.status_code == 200 and "Log out" in response.text, response.text[:500]
    return session


# Among the heaviest live tests: in `make test-slow` (CI runs it after `make test`).
@pytest.mark.slow
def test_a_staff_replay_runs_on_a_celery_worker(stack, history):
    from portal.replay.models import ReplayRun

    session = logged_in(stack, "e2e-staff", "staff-pass-123")
    page = session.get(f"{stack.url}/replay/", timeout=30)
    assert page.status_code == 200
    response = session.post(
        f"{stack.url}/replay/",
        data={
            "since": "2026-03-02T08:00",
            "until": "2026-03-02T12:00",
            "policies": ["fifo", "binpack"],
            "interference": "none",
            "seed": "0",
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
        },
        headers={"Referer": f"{stack.url}/replay/"},
        timeout=30,
    )
    assert response.status_code == 200, response.text[:2000]
    run_id = int(re.search(r"/replay/(\d+)/$", response.url).group(1))

    seen: list[tuple[str, float]] = []

    def finished() -> bool:
        status = session.get(f"{stack.url}/replay/{run_id}/status/", timeout=30).json()
        seen.append((status["status"], status["progress"]))
        return status["status"] in ("done", "failed")

    wait_for(finished, 180, interval=0.2, what=f"replay {run_id} to end")
    run = ReplayRun.objects.get(pk=run_id)
    assert run.status == "done", run.error + "\n" + stack.log_text("scheduler1")[-3000:]
    assert [p for _s, p in seen] == sorted(p for _s, p in seen)  # progress only goes forward
    assert seen[-1] == ("done", 1.0)

    assert run.jobs_exported == JOBS
    fifo = next(r for r in run.summary if r["policy"] == "fifo")
    assert fifo["completed"] == JOBS and fifo["status"] == "complete"
    assert {(r["policy"], r["group"]) for r in run.per_user} == {
        (p, u) for p in ("fifo", "binpack") for u in ("ana", "ben")
    }
    page = session.get(f"{stack.url}/replay/{run_id}/", timeout=30).text
    assert "live (as it ran)" in page and "binpack" in page
    report = session.get(f"{stack.url}/replay/{run_id}/files/report.html", timeout=30)
    assert report.status_code == 200 and "plotly" in report.text.lower()
    # which worker ran it: one of the stack's Celery workers, never the web process
    logs = stack.log_text("scheduler1") + stack.log_text("scheduler2")
    assert "cosched.replay_run" in logs
