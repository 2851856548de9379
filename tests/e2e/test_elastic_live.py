"""``elastic`` live through the whole stack: an emulated elastic job (``workers.emulate_elastic``,
one process per GPU started by the node agent) on a virtual node of three GPUs reports every 10
mini-batches through the training SDK with its job token; the scheduling cycle (Celery, the
``elastic`` policy) answers; each change regroups the job (its next attempt, new
``WORLD_SIZE``, resumed from the checkpoint). It grows from 1 worker while the scaling
efficiency S holds, stops when it does not (the curve is flat past 2 workers: S = 0.10 at
2 -> 3, not above the threshold 0.1), and the rank on a GPU slowed on purpose is replaced by
the idle spare.

Everything is a real process (gunicorn, Celery workers and beat, the node agent, the runners,
the job's ranks); only the GPUs are virtual. tests/portal/test_elastic_live.py runs the same
across two nodes with in-process agents.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import wait_for

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

NODE = "e2e-elastic"


@pytest.fixture(scope="module")
def elastic_cluster(stack, db_access):
    from portal.core.models import Node, PolicySettings

    PolicySettings.objects.all().delete()
    PolicySettings.objects.create(
        name="e2e-elastic",
        policy="elastic",
        params={"scale_step_workers": 1, "scale_interval_batches": 20},
        active=True,
    )
    stack.start_agent(NODE, gpus="V100x3", cores="16", address="127.0.0.1")
    try:
        wait_for(lambda: Node.objects.filter(name=NODE, status="up").exists(), 60, what="the agent")
    except AssertionError as exc:
        raise AssertionError(stack.log_text(f"agent-{NODE}")[-3000:]) from exc
    return stack


def test_an_elastic_job_grows_stops_and_replaces_its_straggler(elastic_cluster, user_token):
    from portal.core.models import ElasticChange, Job

    stack = elastic_cluster
    _, token = user_token
    code, data = stack.api(
        "POST",
        "/api/v1/jobs/",
        token,
        {
            "name": "elastic-e2e",
            "kind": "dl-train",
            "gpus": 1,
            "gpu_memory_mb": 2000,
            "elastic_min_workers": 1,
            "elastic_max_workers": 3,
            "command": "python -m workers.emulate_elastic --curve 1:10,2:20,3:21 --steps 400"
            f" --warmup-s 0.5 --slow-gpu {NODE}/1 --slow-factor 0.4 --slow-after-s 7",
        },
    )
    assert code == 201, data
    job_id = data["id"]

    def finished() -> bool:
        return Job.objects.get(pk=job_id).state in ("COMPLETED", "FAILED", "CANCELLED")

    wait_for(finished, 180, interval=1.0, what="the elastic job")
    job = Job.objects.get(pk=job_id)
    log = stack.log_text(f"agent-{NODE}")[-3000:]
    assert job.state == "COMPLETED", (job.failure_reason, log)
    changes = list(ElasticChange.objects.filter(job_id=job_id).order_by("id"))
    scales = [(c.workers_from, c.workers_to) for c in changes if c.kind == "scale"]
    assert scales[:3] == [(1, 2), (2, 3), (3, 2)], [(c.summary(), c.reason) for c in changes]
    assert "S=0.10" in [c for c in changes if c.kind == "scale"][2].reason
    replaced = [c for c in changes if c.kind == "replace"]
    assert replaced and replaced[0].ranks == [1] and replaced[0].applied, changes
    assert replaced[0].gpus == f"{NODE}/0, {NODE}/2"  # the spare took the slow GPU's rank
    assert all(c.applied for c in changes)
    attempts = list(job.placements.order_by("attempt").values_list("attempt", "outcome"))
    assert [o for _, o in attempts[:-1]] == ["regrouped"] * len(changes)
    detail = stack.api("GET", f"/api/v1/jobs/{job_id}/", token)[1]
    assert len(detail["elastic_changes"]) == len(changes)
