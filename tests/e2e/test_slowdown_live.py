"""``slowdown_dr`` live: three emulated data-parallel jobs (solo times t, 2t, 3t: paper 000's
Table 1) on a virtual node with two GPUs, first with static placements (``loadbalance``), then
with ``slowdown_dr``. The jobs talk to the portal only through the training SDK with their job
tokens; the DR manager answers their epoch ends; the cluster's SD_max_diff (the series the
cluster page plots, ``metrics_cluster_snapshot``) is lower with the method.

Everything is a real process (gunicorn, Celery, the node agent, runners, emulated jobs); only
the GPUs are virtual.
"""

from __future__ import annotations

import statistics
import time

import pytest

from tests.e2e.conftest import wait_for

# No django_db mark: the rows are read and written through the module's ``db_access`` in
# autocommit. A test transaction would hold the policy row the scheduler workers lock when the
# test switches the active policy; ``transaction=True`` would flush (TRUNCATE every table) after
# the test while the module's stack still runs, and the flush can deadlock with a worker's query
# (it did once in CI). The stack's own teardown flushes once its processes have stopped.
pytestmark = pytest.mark.slow

NODE = "e2e-dr"
T = 8.0  # seconds: solo times T, 2T, 3T
ITERATIONS, EPOCHS = 48, 16


@pytest.fixture(scope="module")
def dr_cluster(stack, db_access):
    from portal.core.models import ApplicationProfile, Node, PolicySettings, ProfileGpuTime

    PolicySettings.objects.all().delete()
    PolicySettings.objects.create(name="e2e", policy="loadbalance", active=True)
    for k in (1, 2, 3):
        p = ApplicationProfile.objects.create(
            name=f"dp{k}", kind="dl-train", status="approved", gpu_util_pct=100.0
        )
        ProfileGpuTime.objects.create(profile=p, gpu_model="V100", time_s=k * T)
    stack.start_agent(NODE, gpus="V100x2", cores="16")
    wait_for(
        lambda: Node.objects.filter(name=NODE, status="up").exists(), 40, what="the node agent"
    )
    return stack


def _use(policy: str) -> None:
    from portal.core.models import PolicySettings

    PolicySettings.objects.update(policy=policy)


def _run_three(stack, token: str) -> tuple[list[int], list[float]]:
    """Submit the three jobs, sample the cluster's SD_max_diff while all three run, wait."""
    from portal.core.metrics import metrics_cluster_snapshot
    from portal.core.models import Job

    ids = []
    for k in (1, 2, 3):
        code, data = stack.api(
            "POST",
            "/api/v1/jobs/",
            token,
            {
                "name": f"dp{k}",
                "kind": "dl-train",
                "gpus": 1,
                "gpu_memory_mb": 2000,
                # the three share two GPUs, as in the paper's set-up (a job's GPU is its own
                # unless it allows sharing)
                "sharing": "allowed",
                "profile": f"dp{k}",
                "command": f"python -m workers.emulate --profile dp{k} --iterations {ITERATIONS}"
                f" --epochs {EPOCHS} --data-parallel --report-every 0.25",
            },
        )
        assert code == 201, data
        ids.append(data["id"])
    gaps: list[float] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = set(Job.objects.filter(pk__in=ids).values_list("state", flat=True))
        if states <= {"COMPLETED", "FAILED", "CANCELLED"}:
            break
        if states == {"RUNNING"}:
            sample = {s.metric: s.value for s in metrics_cluster_snapshot()}
            gaps.append(sample["sd_max_diff"])
        time.sleep(0.5)
    jobs = list(Job.objects.filter(pk__in=ids))
    assert all(j.state == "COMPLETED" for j in jobs), [
        (j.pk, j.state, j.failure_reason) for j in jobs
    ]
    return ids, gaps


def test_the_manager_evens_out_slowdowns_live(dr_cluster, user_token):
    from portal.core.models import DataRatioChange, TrainingState

    _, token = user_token
    _use("loadbalance")
    static_ids, static_gaps = _run_three(dr_cluster, token)
    # every job reported through the SDK (a state per attempt), none was rebalanced
    assert TrainingState.objects.filter(placement__job_id__in=static_ids).count() == 3
    assert not DataRatioChange.objects.filter(job_id__in=static_ids).exclude(actor="start")

    _use("slowdown_dr")
    dr_ids, dr_gaps = _run_three(dr_cluster, token)
    changes = list(DataRatioChange.objects.filter(job_id__in=dr_ids, actor="policy:slowdown_dr"))
    assert changes, dr_cluster.log_text(f"agent-{NODE}")[-3000:]
    assert all(c.explanation.startswith(("moved", "gave")) for c in changes)
    assert all(sum(c.new) == 10 and len(c.new) == 2 for c in changes)

    # The cluster's SD_max_diff while the three run together: the static run keeps the gap of
    # Table 1 (SDs 1 and 2); with the method it is lower on average and at the end.
    assert len(static_gaps) >= 5 and len(dr_gaps) >= 5, (static_gaps, dr_gaps)
    static_tail = statistics.fmean(static_gaps[len(static_gaps) // 2 :])
    dr_tail = statistics.fmean(dr_gaps[len(dr_gaps) // 2 :])
    assert static_tail > 0.5, static_gaps
    print(f"SD_max_diff second half: static {static_tail:.2f}, slowdown_dr {dr_tail:.2f}")
    assert dr_tail < static_tail, (static_gaps, dr_gaps)
