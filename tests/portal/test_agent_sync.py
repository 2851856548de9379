"""The portal's side of the node protocol (portal.core.agent_sync) and its HTTP endpoint."""

from __future__ import annotations

import json
import time

import pytest
from django.utils import timezone

from portal.core import services
from portal.core.agent_sync import agent_report_results, agent_sync
from portal.core.metrics import metrics_store_clear
from portal.core.models import (
    Gpu,
    Job,
    JobEvent,
    MetricSample,
    Node,
    Placement,
    PlacementPart,
)
from portal.core.nodes import node_token_create
from workers.protocol import (
    AttemptKey,
    AttemptResult,
    AttemptSpec,
    NodeInfo,
    ResultAck,
    ResultReport,
    RunningAttempt,
    Sample,
    SyncReply,
    SyncRequest,
)

pytestmark = pytest.mark.django_db

INFO = NodeInfo(
    kind="gpu",
    cores=16,
    memory_mb=65536,
    backend="virtual",
    gpus=(
        {"index": 0, "model": "A30", "memory_mb": 24576},
        {"index": 1, "model": "A30", "memory_mb": 24576},
    ),
    address="10.0.0.5",
)


class Agent:
    """Sends requests for one node with increasing sequence numbers."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.seq = 0

    def sync(self, **kw) -> SyncReply:
        self.seq += 1
        return agent_sync(
            SyncRequest(node=self.node, instance="t", seq=self.seq, sent_at=time.time(), **kw)
        )

    def started(self, job: Job, attempt: int = 1, pid: int = 99) -> SyncReply:
        return self.sync(running=(RunningAttempt(job.pk, attempt, "running", time.time(), pid),))

    def ended(self, job: Job, outcome: str, code: int | None, attempt: int = 1) -> SyncReply:
        detail = f"exit code {code}" if outcome == "exited" else outcome
        result = AttemptResult(job.pk, attempt, outcome, time.time(), code, detail)
        return self.sync(results=(result,))


@pytest.fixture
def gpu1(db) -> Agent:
    agent = Agent("gpu-1")
    assert agent.sync(info=INFO).applied
    return agent


def _placed(owner, node_names: list[str], *, state: str = "SCHEDULED", command="run") -> Job:
    job = Job.objects.create(
        owner=owner, name="j", command=command, gpus=len(node_names), state=state
    )
    nodes = [Node.objects.get(name=n) for n in node_names]
    placement = Placement.objects.create(
        job=job,
        attempt=Placement.objects.filter(job=job).count() + 1,
        node=nodes[0],
        policy="test",
    )
    for rank, node in enumerate(nodes):
        PlacementPart.objects.create(
            placement=placement, node=node, node_rank=rank, gpu_indices=[0], cpus=1
        )
        placement.gpus.add(Gpu.objects.get(node=node, index=0))
    return job


def _desired(reply: SyncReply) -> list[tuple[int, int, bool]]:
    return [(a.job_id, a.attempt, a.launch) for a in reply.desired]


def test_an_unknown_node_is_asked_for_its_info_then_registered(db):
    agent = Agent("new-node")
    reply = agent.sync()
    assert reply.send_info and not reply.applied and not Node.objects.exists()
    reply = agent.sync(info=INFO)
    assert reply.applied and reply.lease_s == 20.0 and reply.sync_interval_s == 1.0
    node = Node.objects.get(name="new-node")
    assert node.address == "10.0.0.5" and node.gpus.count() == 2 and node.sync_seq == 2


def test_an_older_request_is_refused_and_changes_nothing(alice, gpu1):
    job = _placed(alice, ["gpu-1"])
    gpu1.sync()  # offered
    gpu1.seq -= 1  # a request older than the newest applied one
    reply = gpu1.started(job)
    assert reply.resync_from == gpu1.seq + 1 and not reply.applied
    assert Job.objects.get(pk=job.pk).state == "SCHEDULED"
    gpu1.seq = reply.resync_from - 1
    gpu1.started(job)
    assert Job.objects.get(pk=job.pk).state == "RUNNING"


def test_a_launch_is_offered_with_what_it_needs_then_only_its_pause_flag(alice, gpu1):
    job = _placed(alice, ["gpu-1"], command="python train.py")
    spec = gpu1.sync().desired[0]
    assert (spec.job_id, spec.attempt, spec.launch, spec.paused) == (job.pk, 1, True, False)
    assert spec.command == "python train.py" and spec.gpu_model == "A30"
    assert spec.owner == "alice" and spec.memory_mb is None  # the node maps the owner's account
    assert [(p.node, p.node_rank, p.gpu_indices, p.address) for p in spec.parts] == [
        ("gpu-1", 0, (0,), "10.0.0.5")
    ]
    part = PlacementPart.objects.get(placement__job=job)
    assert part.offered_at is not None and part.started_at is None

    reply = gpu1.started(job, pid=4242)
    job.refresh_from_db()
    assert job.state == "RUNNING"
    event = JobEvent.objects.filter(job=job).latest("id")
    assert event.message == "started on gpu-1 GPU 0 (exclusive), attempt 1 (pid 4242)"
    assert event.actor == "node:gpu-1"
    spec = reply.desired[0]
    assert not spec.launch and spec.command == "" and spec.profile is None

    services.job_pause(job, actor="user:alice")
    assert gpu1.started(job).desired[0].paused


def test_a_result_is_recorded_once_however_often_it_is_sent(alice, gpu1):
    job = _placed(alice, ["gpu-1"])
    gpu1.sync()
    gpu1.started(job)
    for _ in range(3):  # the acknowledgement got lost twice
        reply = gpu1.ended(job, "exited", 0)
        assert reply.acked == (AttemptKey(job.pk, 1),) and reply.desired == ()
    job.refresh_from_db()
    assert job.state == "COMPLETED" and job.exit_code == 0
    assert JobEvent.objects.filter(job=job, to_state="COMPLETED").count() == 1
    part = PlacementPart.objects.get(placement__job=job)
    assert (part.outcome, part.exit_code) == ("exited", 0) and part.reported_at is not None


@pytest.mark.parametrize(
    ("outcome", "code", "state", "reason"),
    [
        ("exited", 3, "FAILED", "exit code 3"),
        ("exited", -9, "FAILED", "exit code -9"),
        ("launch_failed", None, "FAILED", "launch_failed"),
        ("lease_expired", -15, "PENDING", ""),
        ("stopped", -15, "PENDING", ""),
        ("lost", None, "PENDING", ""),
    ],
)
def test_how_the_current_attempt_ended_decides_the_job(alice, gpu1, outcome, code, state, reason):
    job = _placed(alice, ["gpu-1"])
    gpu1.sync()
    gpu1.started(job)
    gpu1.ended(job, outcome, code)
    job.refresh_from_db()
    assert job.state == state and job.failure_reason == reason
    attempt = job.placements.get()
    assert attempt.outcome == {"FAILED": "failed", "PENDING": "requeued"}[state]
    if state == "PENDING":
        assert f"attempt 1 on gpu-1 ended: {outcome}" in attempt.end_reason


def test_a_job_that_ends_before_its_start_was_reported_goes_through_running(alice, gpu1):
    job = _placed(alice, ["gpu-1"])
    gpu1.sync()
    gpu1.ended(job, "exited", 0)
    states = list(JobEvent.objects.filter(job=job).values_list("to_state", flat=True))
    assert states[-2:] == ["RUNNING", "COMPLETED"]


def test_a_result_of_a_superseded_attempt_does_not_touch_the_job(alice, gpu1):
    Agent("gpu-2").sync(info=INFO)
    job = _placed(alice, ["gpu-1"])
    gpu1.sync()
    gpu1.started(job)
    services.job_transition(job, "PENDING", actor="scheduler", message="preempted")
    job = _placed_again(job, "gpu-2")

    gpu1.ended(job, "exited", 0)

    job.refresh_from_db()
    assert job.state == "SCHEDULED"
    old = PlacementPart.objects.get(placement__job=job, placement__attempt=1)
    assert old.outcome == "exited" and old.settled_at is not None
    note = JobEvent.objects.filter(job=job).latest("id")
    assert note.message == "attempt 1 on gpu-1 (no longer current) ended: exit code 0"


def _placed_again(job: Job, node_name: str) -> Job:
    node = Node.objects.get(name=node_name)
    placement = Placement.objects.create(job=job, attempt=2, node=node, policy="test")
    PlacementPart.objects.create(placement=placement, node=node, gpu_indices=[0])
    services.job_transition(job, "SCHEDULED", actor="scheduler", expected="PENDING")
    return Job.objects.get(pk=job.pk)


def test_the_next_attempt_is_held_back_until_the_last_one_is_settled(alice, gpu1):
    gpu2 = Agent("gpu-2")
    gpu2.sync(info=INFO)
    job = _placed(alice, ["gpu-1"])
    gpu1.sync()
    gpu1.started(job)
    services.job_transition(job, "PENDING", actor="scheduler", message="preempted")
    _placed_again(job, "gpu-2")
    assert _desired(gpu2.sync()) == []  # attempt 1 may still run on gpu-1
    assert gpu1.started(job).desired == ()  # ... where it is not wanted any more
    assert _desired(gpu2.sync()) == []
    gpu1.ended(job, "killed", -15)
    assert _desired(gpu2.sync()) == [(job.pk, 2, True)]


def test_a_started_attempt_the_agent_no_longer_lists_is_lost_and_requeued(alice, gpu1):
    job = _placed(alice, ["gpu-1"])
    gpu1.sync()
    gpu1.started(job)
    gpu1.sync()  # a restarted agent that lost its state lists nothing
    job.refresh_from_db()
    assert job.state == "PENDING"
    part = PlacementPart.objects.get(placement__job=job)
    assert part.outcome == "lost" and part.settled_at is not None
    assert "no longer runs attempt 1" in job.placements.get().end_reason


def test_an_offer_the_agent_never_got_is_offered_again(alice, gpu1):
    job = _placed(alice, ["gpu-1"])
    assert _desired(gpu1.sync()) == [(job.pk, 1, True)]
    assert _desired(gpu1.sync()) == [(job.pk, 1, True)]  # the reply was lost: still launchable
    assert Job.objects.get(pk=job.pk).state == "SCHEDULED"


def test_an_offer_of_an_ended_attempt_that_never_started_is_settled(alice, gpu1):
    job = _placed(alice, ["gpu-1"])
    gpu1.sync()
    services.job_cancel(job, actor="user:alice")
    gpu1.sync()
    part = PlacementPart.objects.get(placement__job=job)
    assert part.settled_at is not None and part.detail == "never started"


def test_a_gang_runs_when_every_rank_started_and_completes_when_every_rank_did(alice, gpu1):
    gpu2 = Agent("gpu-2")
    gpu2.sync(info=INFO)
    job = _placed(alice, ["gpu-1", "gpu-2"])
    spec = gpu2.sync().desired[0]
    assert spec.node_rank == 1 and [p.node for p in spec.parts] == ["gpu-1", "gpu-2"]
    gpu1.sync()
    gpu1.started(job)
    assert Job.objects.get(pk=job.pk).state == "SCHEDULED"
    gpu2.started(job)
    assert Job.objects.get(pk=job.pk).state == "RUNNING"
    assert JobEvent.objects.filter(job=job).latest("id").message == (
        "all 2 ranks started on gpu-1, gpu-2, attempt 1"
    )
    gpu1.ended(job, "exited", 0)
    assert Job.objects.get(pk=job.pk).state == "RUNNING"
    gpu2.ended(job, "exited", 0)
    assert Job.objects.get(pk=job.pk).state == "COMPLETED"


def test_one_failed_rank_fails_the_gang_and_the_others_are_stopped(alice, gpu1):
    gpu2 = Agent("gpu-2")
    gpu2.sync(info=INFO)
    job = _placed(alice, ["gpu-1", "gpu-2"])
    gpu1.sync()
    gpu2.sync()
    gpu1.started(job)
    gpu2.started(job)
    gpu2.ended(job, "exited", 1)
    job.refresh_from_db()
    assert job.state == "FAILED" and job.failure_reason == "exit code 1 (node rank 1)"
    assert gpu1.started(job).desired == ()  # rank 0 is no longer wanted: its agent stops it


def test_samples_land_on_the_nodes_gpus_and_the_current_attempt_only(alice, gpu1):
    metrics_store_clear()
    job = _placed(alice, ["gpu-1"])
    gpu1.sync()
    now = time.time()
    gpu1.sync(
        running=(RunningAttempt(job.pk, 1, "running", now, 5),),
        samples=(
            Sample("util_pct", 70.0, now, 1),
            Sample("progress", 0.4, now, None, job.pk, 1),
            Sample("progress", 0.9, now, None, job.pk, 7),  # not this job's attempt
            Sample("util_pct", 1.0, now, 5),  # no such GPU here
        ),
    )
    gpu = Gpu.objects.get(node__name="gpu-1", index=1)
    assert list(MetricSample.objects.filter(gpu=gpu).values_list("value", flat=True)) == [70.0]
    assert list(MetricSample.objects.filter(job=job).values_list("value", flat=True)) == [0.4]
    metrics_store_clear()


def test_the_lease_is_renewed_and_results_recorded_with_redis_down(alice, gpu1, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    job = _placed(alice, ["gpu-1"])
    gpu1.sync()
    gpu1.started(job)
    before = Node.objects.get(name="gpu-1").lease_expires_at
    reply = gpu1.sync(
        results=(AttemptResult(job.pk, 1, "exited", time.time(), 0, "exit code 0"),),
        samples=(Sample("util_pct", 10.0, time.time(), 0),),
    )
    assert reply.acked == (AttemptKey(job.pk, 1),)
    assert Job.objects.get(pk=job.pk).state == "COMPLETED"
    assert Node.objects.get(name="gpu-1").lease_expires_at > before
    assert MetricSample.objects.filter(metric="util_pct").exists()  # the history still


# --- the HTTP endpoint ----------------------------------------------------------------------------


def _post(client, body, token: str | None, **headers):
    if token is not None:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return client.post("/agent/v1/sync", data=body, content_type="application/json", **headers)


def test_the_endpoint_syncs_a_node_with_its_own_token(client, db):
    _, key = node_token_create("gpu-9")
    request = SyncRequest(node="gpu-9", instance="x", seq=1, sent_at=0.0, info=INFO)
    response = _post(client, request.to_json(), key)
    assert response.status_code == 200, response.content
    reply = SyncReply.from_json(response.content)
    assert reply.applied and Node.objects.get(name="gpu-9").lease_expires_at > timezone.now()


def test_a_runner_reports_a_result_its_agent_did_not(alice, gpu1, client):
    """The agent is frozen; its runner sends the result itself: recorded exactly once, and
    the agent's own report later is only acknowledged."""
    _, key = node_token_create("gpu-1")
    job = _placed(alice, ["gpu-1"])
    gpu1.sync()
    gpu1.started(job)
    result = AttemptResult(job.pk, 1, "exited", time.time(), 0, "exit code 0")
    body = ResultReport(node="gpu-1", results=(result,)).to_json()
    response = client.post(
        "/agent/v1/results", data=body, content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )  # fmt: skip
    assert response.status_code == 200, response.content
    assert ResultAck.from_json(response.content).acked == (AttemptKey(job.pk, 1),)
    job.refresh_from_db()
    assert job.state == "COMPLETED"
    lease = Node.objects.get(name="gpu-1").lease_expires_at
    # The thawed agent reports it too, in a sync: acknowledged, nothing recorded twice.
    assert gpu1.ended(job, "exited", 0).acked == (AttemptKey(job.pk, 1),)
    assert JobEvent.objects.filter(job=job, to_state="COMPLETED").count() == 1
    assert Node.objects.get(name="gpu-1").lease_expires_at > lease  # only the sync renewed it


def test_a_result_report_renews_no_lease_and_infers_nothing(alice, gpu1):
    other = _placed(alice, ["gpu-1"])
    job = _placed(alice, ["gpu-1"])
    gpu1.sync()
    now = time.time()
    gpu1.sync(running=tuple(RunningAttempt(j.pk, 1, "running", now, 9) for j in (other, job)))
    node = Node.objects.get(name="gpu-1")
    agent_report_results(
        ResultReport("gpu-1", (AttemptResult(job.pk, 1, "exited", time.time(), 0, "ok"),))
    )
    assert Node.objects.get(name="gpu-1").lease_expires_at == node.lease_expires_at
    assert Job.objects.get(pk=other.pk).state == "RUNNING"  # not listed: not lost


def test_the_endpoint_refuses_missing_wrong_and_foreign_tokens(client, db):
    _, key = node_token_create("gpu-9")
    body = SyncRequest(node="gpu-1", instance="x", seq=1, sent_at=0.0).to_json()
    response = _post(client, body, None)
    assert response.status_code == 401 and response["WWW-Authenticate"] == "Bearer"
    assert _post(client, body, "cosn_nope").status_code == 401
    response = _post(client, body, key)
    assert response.status_code == 403
    assert "node 'gpu-9'" in response.json()["error"] and not Node.objects.exists()


def test_the_endpoint_names_the_bad_field_and_refuses_huge_bodies(client, db):
    _, key = node_token_create("gpu-9")
    body = json.loads(SyncRequest(node="gpu-9", instance="x", seq=1, sent_at=0.0).to_json())
    body["seq"] = "one"
    response = _post(client, json.dumps(body), key)
    assert response.status_code == 400
    assert response.json() == {"error": "seq: expected an integer, got a string"}
    response = _post(client, "{}", key, CONTENT_LENGTH=str(64 * 2**20))
    assert response.status_code == 413
    assert client.get("/agent/v1/sync").status_code == 405


def test_a_launch_carries_its_owner_and_memory_for_the_nodes_isolation(alice, gpu1):
    job = _placed(alice, ["gpu-1"])
    Job.objects.filter(pk=job.pk).update(memory_mb=3072)
    spec = gpu1.sync().desired[0]
    assert (spec.owner, spec.memory_mb) == ("alice", 3072)
    assert AttemptSpec.read(spec.to_dict(), "spec") == spec  # through the wire format
