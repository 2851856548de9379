"""Preemption and time limits on the whole live path: the HTTP API, the Celery scheduler
workers, a node agent process syncing over HTTP (its token only), runners and job processes.

A user's emulated job is preempted by a staff member through the API while it runs: its agent
stops it (SIGTERM; it saves a checkpoint), the scheduler places it again, and attempt 2 resumes
from the checkpoint in ``COSCHED_CHECKPOINT_DIR`` and completes. A job past its time limit ends
FAILED (time limit)."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import wait_for
from tests.e2e.test_live_path import job_row, submit, wait_state

pytestmark = pytest.mark.django_db

NODE = "e2e-preempt-gpu"


@pytest.fixture(scope="module")
def cluster(stack, db_access):
    from portal.core.models import Node, PolicySettings

    PolicySettings.objects.all().delete()
    PolicySettings.objects.create(name="e2e", policy="fifo", active=True)
    stack.start_agent(NODE, gpus="TitanXpx2", cores="8")
    wait_for(lambda: Node.objects.filter(name=NODE, status="up").exists(), 40, what="the agent")
    return stack


@pytest.fixture(scope="module")
def staff_token(stack, db_access) -> str:
    from django.contrib.auth import get_user_model

    from portal.front.services import token_create

    staff = get_user_model().objects.create_user(
        "e2e-staff", "s@example.org", "e2e-staff-pass-1", is_staff=True
    )
    return token_create(staff, name="e2e")[1]


def test_a_job_preempted_through_the_api_resumes_from_its_checkpoint(
    cluster, user_token, staff_token
):
    _, token = user_token
    job_id = submit(
        cluster,
        token,
        name="preempted",
        command=(
            "exec python -m workers.emulate --profile e2e --duration 6 --iterations 60 "
            "--report-every 0.2 --checkpoint-every 0.3"
        ),
    )
    checkpoint = cluster.data_dir() / "checkpoints" / f"job-{job_id}" / "emulate.json"

    def saved() -> float:
        try:
            return float(json.loads(checkpoint.read_text())["fraction"])
        except (OSError, ValueError, KeyError):
            return 0.0

    wait_for(lambda: saved() >= 0.25, 60, what="a checkpoint past 25 %")
    code, body = cluster.api(
        "POST", f"/api/v1/jobs/{job_id}/preempt/", staff_token, {"reason": "e2e: make room"}
    )
    assert code == 200, body
    code, denied = cluster.api("POST", f"/api/v1/jobs/{job_id}/preempt/", token)
    assert code == 403, denied  # users do not preempt, not even their own jobs

    job = wait_state(job_id, {"COMPLETED", "FAILED"}, timeout=90)
    assert job.state == "COMPLETED", (job.failure_reason, cluster.log_text(f"agent-{NODE}"))
    code, body = cluster.api("GET", f"/api/v1/jobs/{job_id}/", token)
    attempts = body["attempts"]
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "preempted"), (2, "completed")]
    assert attempts[0]["end_reason"] == "e2e: make room" and attempts[0]["nodes"] == [NODE]
    assert body["requeue_count"] == 1
    part = job_row(job_id).placements.get(attempt=1).parts.get()
    assert part.outcome == "killed" and part.exit_code == 143  # saved, then exited on SIGTERM
    log = (cluster.data_dir() / "logs" / f"job-{job_id}.log").read_text()
    starts = [line for line in log.splitlines() if line.startswith("@cosched start")]
    assert len(starts) == 2
    resumed = float(starts[1].split("resumed_from=")[1].split()[0])
    assert resumed >= 0.25  # attempt 2 went on from where attempt 1 stopped


def test_a_job_past_its_time_limit_fails_with_reason_time_limit(cluster, user_token):
    _, token = user_token
    job_id = submit(cluster, token, name="limited", command="sleep 120", time_limit="2s")
    job = wait_state(job_id, {"COMPLETED", "FAILED"}, timeout=60)
    assert job.state == "FAILED" and job.failure_reason.startswith("time limit 00:00:02 reached")
    code, body = cluster.api("GET", f"/api/v1/jobs/{job_id}/", token)
    assert body["end_label"] == "time limit" and body["time_limit"] == 2
    assert [a["outcome"] for a in body["attempts"]] == ["failed"]
