"""Elastic jobs in the portal (issue 17): the declaration in API, form and CLI contract with
field errors; the policy's proposals recorded with their reason and S; the job page shows them."""

from __future__ import annotations

import pytest

from portal.core.elastic import elastic_change_propose
from portal.core.models import (
    ElasticChange,
    Gpu,
    Job,
    JobEvent,
    Node,
    Placement,
    PlacementPart,
    PolicySettings,
)
from portal.core.scheduling import build_snapshot, run_cycle
from portal.core.services import job_transition
from portal.core.states import JobState
from scheduler import elastic as engine
from scheduler.domain import Action, ActionKind

pytestmark = pytest.mark.django_db

URL = "/api/v1/jobs/"
ELASTIC = {
    "name": "resnet-elastic",
    "command": "python train.py",
    "gpus": 2,
    "kind": "dl-train",
    "elastic_min_workers": 1,
    "elastic_max_workers": 8,
    "elastic_value_per_hour": 2.5,
    "max_global_batch": 1024,
}


def test_api_stores_and_returns_the_elastic_declaration(alice_api):
    response = alice_api.post(URL, ELASTIC, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["elastic_value_per_hour"] == 2.5
    assert body["max_global_batch"] == 1024
    assert body["elastic_deadline_s"] is None
    job = Job.objects.get(pk=body["id"])
    assert (job.elastic_value_per_hour, job.max_global_batch) == (2.5, 1024)
    detail = alice_api.get(f"{URL}{job.pk}/").json()
    assert detail["elastic_changes"] == []


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"elastic_deadline_s": 3600}, "elastic_value_per_hour", "not both"),
        ({"elastic_value_per_hour": -1}, "elastic_value_per_hour", "greater than or equal to 0"),
        ({"elastic_value_per_hour": 1e7}, "elastic_value_per_hour", "less than or equal to"),
        ({"elastic_value_per_hour": "lots"}, "elastic_value_per_hour", "valid number"),
        ({"max_global_batch": 0}, "max_global_batch", "greater than or equal to 1"),
        (
            {"max_global_batch": 2, "elastic_min_workers": 4},
            "max_global_batch",
            "at least elastic_min_workers (4)",
        ),
        (
            {"elastic_value_per_hour": None, "elastic_deadline_s": 0},
            "elastic_deadline_s",
            "greater than or equal to 1",
        ),
        (
            {"elastic_min_workers": None, "elastic_max_workers": None},
            "max_global_batch",
            "only for an elastic job",
        ),
    ],
)
def test_api_bad_elastic_input_is_a_400_on_the_field_and_stores_nothing(
    alice_api, changes, field, message
):
    response = alice_api.post(URL, {**ELASTIC, **changes}, format="json")
    assert response.status_code == 400
    errors = response.json()
    assert field in errors, errors
    assert any(message in text for text in errors[field]), errors[field]
    assert Job.objects.count() == 0


def test_api_reports_every_bad_elastic_field_at_once(alice_api):
    payload = {
        **ELASTIC,
        "elastic_min_workers": None,
        "elastic_max_workers": None,
        "elastic_deadline_s": 60,
    }
    errors = alice_api.post(URL, payload, format="json").json()
    assert {"elastic_deadline_s", "elastic_value_per_hour", "max_global_batch"} <= set(errors)


FORM = {
    "name": "resnet-elastic",
    "command": "python train.py",
    "gpus": "2",
    "cpus": "1",
    "kind": "dl-train",
    "priority": "0",
    "elastic_min_workers": "1",
    "elastic_max_workers": "8",
    "elastic_deadline_s": "7200",
    "max_global_batch": "512",
    "submit_token": "feedfacefeedface",
}


def test_form_submits_an_elastic_job(client, alice):
    client.force_login(alice)
    response = client.post("/jobs/new/", FORM)
    assert response.status_code == 302
    job = Job.objects.get()
    assert (job.elastic_deadline_s, job.max_global_batch) == (7200, 512)
    assert job.elastic_value_per_hour is None
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "finish within 7200 s of the start" in html
    assert "No change yet" in html


def test_form_shows_elastic_errors_next_to_their_fields(client, alice):
    client.force_login(alice)
    response = client.post("/jobs/new/", {**FORM, "elastic_value_per_hour": "3"})
    assert response.status_code == 400
    html = response.content.decode()
    start = html.index('id="id_elastic_value_per_hour_error"')
    assert "not both" in html[start : start + 300]
    assert Job.objects.count() == 0


# -- proposals and the job page ----------------------------------------------------------------


def running_elastic_job(owner, gpus: int = 2, node_gpus: int = 4) -> Job:
    node = Node.objects.create(name="g1", kind="gpu", cores=8, memory_mb=65536)
    for i in range(node_gpus):
        Gpu.objects.create(node=node, index=i, model="V100", memory_mb=16384, uuid=f"GPU-g1-{i}")
    job = Job.objects.create(
        owner=owner,
        name="elastic",
        command="true",
        gpus=gpus,
        gpu_memory_mb=4000,
        elastic_min_workers=1,
        elastic_max_workers=node_gpus,
    )
    job_transition(job, JobState.SCHEDULED, actor="t")
    placement = Placement.objects.create(job=job, node=node, gpu_memory_mb=4000, policy="t")
    placement.gpus.set(list(node.gpus.filter(index__lt=gpus)))
    PlacementPart.objects.create(placement=placement, node=node, gpu_indices=list(range(gpus)))
    job_transition(job, JobState.RUNNING, actor="t")
    return job


def measured_state(workers: int, rate: float, windows: int = 6) -> dict:
    cfg = engine.ElasticConfig()
    state = engine.start(engine.ElasticJob(1, 8), workers, 1e5)
    for _ in range(windows):
        window = engine.Window(workers, 10, 10 / rate, (1.0,) * workers, 1e5, 0.0)
        state = engine.observe(state, window, cfg)
    return engine.state_to_dict(state)


def test_a_cycle_of_the_elastic_policy_records_a_change_with_its_reason(alice, client):
    job = running_elastic_job(alice)
    job.elastic_state = measured_state(2, 10.0)
    job.save()
    PolicySettings.objects.create(
        name="e", policy="elastic", params={"scale_step_workers": 2}, active=True
    )
    snap = build_snapshot()
    assert snap.state.running[0].elastic.throughput_at(2) == pytest.approx(10.0)

    result = run_cycle()
    assert ("set_workers", job.pk) in result.actions
    change = ElasticChange.objects.get(job=job)
    assert (change.kind, change.workers_from, change.workers_to) == ("scale", 2, 4)
    assert "probe 4 workers" in change.reason and not change.applied
    job.refresh_from_db()
    assert job.elastic_state["in_transition"] is True
    assert JobEvent.objects.filter(job=job, message__contains="2 -> 4 workers").exists()

    run_cycle()  # under way: nothing new until the job has taken it
    assert ElasticChange.objects.filter(job=job).count() == 1


def test_job_page_and_api_show_changes_with_s_to_the_owner_only(alice, bob, client, bob_api):
    job = running_elastic_job(alice)
    job.elastic_state = measured_state(2, 10.0)
    job.save()
    action = Action(
        ActionKind.SET_WORKERS,
        str(job.pk),
        "elastic",
        "scale up: 2->4 workers: R 10->18 steps/s, S=0.80 > threshold 0.1",
        value={"workers_from": 2, "workers": 4, "efficiency": 0.8, "local_batch": 256},
    )
    assert elastic_change_propose(job.pk, action, actor="scheduler") is not None
    assert elastic_change_propose(job.pk, action, actor="scheduler") is None  # in transition

    client.force_login(alice)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    table = html[html.index('id="elastic-changes"') :]
    assert "2 → 4 workers" in table and "0.80" in table and "256" in table
    assert "S=0.80 &gt; threshold 0.1" in table and "proposed" in table

    api = client.get(f"{URL}{job.pk}/").json()
    assert api["elastic_changes"][0]["workers_to"] == 4
    assert api["elastic_changes"][0]["efficiency"] == 0.8
    assert api["elastic_changes"][0]["summary"] == "2 -> 4 workers (S=0.80)"
    assert bob_api.get(f"{URL}{job.pk}/").status_code == 404


def test_a_replacement_is_recorded_with_its_ranks(alice):
    job = running_elastic_job(alice)
    job.elastic_state = measured_state(2, 10.0)
    job.save()
    action = Action(
        ActionKind.REPLACE_WORKERS, str(job.pk), "elastic", "persistent straggler", value=(1,)
    )
    change = elastic_change_propose(job.pk, action, actor="scheduler")
    assert change is not None
    assert (change.kind, change.ranks, change.workers_to) == ("replace", [1], 2)
    assert change.summary() == "replace rank(s) 1"


def test_no_proposal_for_a_job_that_is_not_running(alice):
    job = running_elastic_job(alice)
    job.elastic_state = measured_state(2, 10.0)
    job.save()
    job_transition(job, JobState.COMPLETED, actor="t")
    action = Action(ActionKind.SET_WORKERS, str(job.pk), "elastic", "x", value={"workers": 4})
    assert elastic_change_propose(job.pk, action, actor="scheduler") is None
    assert not ElasticChange.objects.exists()


# -- the job's statistics, the cycle's proposals, the job following them -------------------------


def report(job: Job, workers: int, rate: float, ranks=None, checkpointed=False) -> dict:
    from portal.core.elastic import elastic_window_report

    rates = list(ranks) if ranks is not None else [1.0] * workers
    return elastic_window_report(
        job,
        workers=workers,
        batches=10,
        seconds=10 / rate,
        rank_rates=rates,
        remaining_steps=1e5,
        checkpointed=checkpointed,
    )


def active_gpus(job: Job) -> list[str]:
    placement = job.placements.get(active=True)
    return [f"{g.node.name}/{g.index}" for g in placement.gpus.order_by("node__name", "index")]


def test_the_job_grows_while_s_holds_and_stops_when_it_does_not(alice):
    # R(w): linear to 2 workers, +5 % for the third: S = (21 - 20) / (20 / 2) = 0.1, not > 0.1
    curve = {1: 10.0, 2: 20.0, 3: 21.0, 4: 21.5}
    job = running_elastic_job(alice, gpus=1, node_gpus=4)
    PolicySettings.objects.create(
        name="e",
        policy="elastic",
        params={"scale_step_workers": 1, "scale_interval_batches": 20},
        active=True,
    )
    workers, seen = 1, [1]
    for _ in range(40):
        for _ in range(3):
            report(job, workers, curve[workers], checkpointed=True)
        run_cycle()
        reply = report(job, workers, curve[workers], checkpointed=True)
        if reply["regroup"]:  # the next attempt runs the new count
            workers = reply["workers"]
            seen.append(workers)
            assert len(active_gpus(job)) == workers
        if len(seen) >= 4:
            break
    assert seen == [1, 2, 3, 2]
    changes = list(ElasticChange.objects.filter(job=job).order_by("id"))
    assert [(c.workers_from, c.workers_to) for c in changes] == [(1, 2), (2, 3), (3, 2)]
    assert "S=0.10 <= threshold 0.1" in changes[-1].reason and "condition 1" in changes[-1].reason
    assert [c.attempt for c in changes] == [2, 3, 4] and all(c.applied for c in changes)
    for _ in range(3):  # converged: it holds
        report(job, 2, curve[2], checkpointed=True)
        run_cycle()
    assert ElasticChange.objects.filter(job=job).count() == 3
    # each change was an attempt; the last ranks leave, rank 0's GPU stays
    outcomes = list(job.placements.order_by("attempt").values_list("outcome", "active"))
    assert outcomes == [("regrouped", False)] * 3 + [("", True)]
    assert active_gpus(job) == ["g1/0", "g1/1"]
    assert JobEvent.objects.filter(job=job, message__contains="runs 3 ranks on g1/0, g1/1, g1/2")
    snap = build_snapshot()
    assert [g.idle for g in snap.state.node("g1").gpus] == [False, False, True, True]


def test_a_slowed_rank_is_replaced_by_an_idle_spare(alice, client):
    job = running_elastic_job(alice, gpus=2, node_gpus=3)
    job.elastic_min_workers = job.elastic_max_workers = 2
    job.save()
    PolicySettings.objects.create(name="e", policy="elastic", params={}, active=True)
    for _ in range(4):
        report(job, 2, 10.0, ranks=[1.0, 0.3])
    run_cycle()
    reply = report(job, 2, 10.0, ranks=[1.0, 0.3])
    assert reply["replace_ranks"] == [1] and reply["workers"] == 2 and not reply["regroup"]
    change = ElasticChange.objects.get(job=job)
    assert change.kind == "replace" and "rank 1" in change.reason and not change.applied
    reply = report(job, 2, 10.0, ranks=[1.0, 0.3], checkpointed=True)
    assert reply["regroup"] and reply["attempt"] == 2
    change.refresh_from_db()
    assert change.applied and change.gpus == "g1/0, g1/2"
    assert active_gpus(job) == ["g1/0", "g1/2"]  # rank 1 left the slow GPU for the spare
    from portal.core.models import OutboxMessage

    assert OutboxMessage.objects.filter(kind="schedule", reason__contains="released GPUs").exists()
    job.refresh_from_db()
    assert job.elastic_state["straggler_ewma"] == [1.0, 1.0]  # a new group starts afresh
    assert not job.elastic_state["in_transition"]
    client.force_login(alice)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "applied: attempt 2 on g1/0, g1/2" in html[html.index('id="elastic-changes"') :]
    assert "Regrouped (elastic)" in html  # attempt 1 in the attempts table
    assert "to start with (elastic" in html


def test_a_change_without_the_gpus_it_needs_is_refused_and_the_engine_goes_on(alice, bob):
    job = running_elastic_job(alice, gpus=2, node_gpus=3)
    job.elastic_state = measured_state(2, 10.0)
    job.save()
    action = Action(
        ActionKind.SET_WORKERS,
        str(job.pk),
        "elastic",
        "probe 4 workers",
        value={"workers_from": 2, "workers": 4, "efficiency": None, "local_batch": None},
    )
    assert elastic_change_propose(job.pk, action, actor="scheduler") is not None
    reply = report(job, 2, 10.0, checkpointed=True)
    assert not reply["regroup"] and reply["workers"] == 2
    change = ElasticChange.objects.get(job=job)
    assert not change.applied and change.refused == "only 1 idle V100 GPU(s), 2 needed"
    job.refresh_from_db()
    assert not job.elastic_state["in_transition"]
    assert job.placements.get(active=True).attempt == 1  # nothing was changed
    assert JobEvent.objects.filter(job=job, message__contains="not applied: only 1 idle").exists()
    detail = client_api_detail(alice, job)
    assert detail["elastic_changes"][0]["refused"] == "only 1 idle V100 GPU(s), 2 needed"


def client_api_detail(user, job: Job) -> dict:
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(user)
    return api.get(f"{URL}{job.pk}/").json()


def test_a_window_at_another_count_than_the_attempts_is_refused(alice):
    from portal.core.elastic import ElasticReportError

    job = running_elastic_job(alice, gpus=2)
    with pytest.raises(ElasticReportError) as info:
        report(job, 3, 10.0)
    assert info.value.errors == {"workers": ["attempt 1 runs 2 workers, not 3"]}


def test_a_bad_window_names_its_fields(alice):
    from portal.core.elastic import ElasticReportError, elastic_window_report

    job = running_elastic_job(alice)
    with pytest.raises(ElasticReportError) as info:
        elastic_window_report(
            job, workers=0, batches=10, seconds=-1.0, rank_rates=["x"], remaining_steps=1.0
        )
    assert {"workers", "seconds", "rank_rates"} <= set(info.value.errors)
    job.elastic_state = {}
    job.save()
    plain = Job.objects.create(owner=alice, name="plain", command="true")
    with pytest.raises(ElasticReportError) as info:
        elastic_window_report(plain, workers=1, batches=10, seconds=1.0)
    assert "job" in info.value.errors


def test_a_due_decision_asks_for_a_cycle_at_once(alice):
    from portal.core.models import OutboxMessage

    job = running_elastic_job(alice, gpus=1, node_gpus=4)
    PolicySettings.objects.create(
        name="e",
        policy="elastic",
        params={"scale_step_workers": 1, "scale_interval_batches": 20},
        active=True,
    )
    report(job, 1, 10.0)  # the first window after a change is not measured
    assert not OutboxMessage.objects.filter(kind="schedule").exists()  # still measuring
    report(job, 1, 10.0)  # 20 mini-batches, one window measured: probe 2 is due
    assert OutboxMessage.objects.filter(kind="schedule", reason__contains="elastic").exists()


def test_a_regroup_does_not_restart_the_time_limit(alice, client):
    """The time limit counts one run of an elastic job across its regroups: the next group
    gets what is left, a regroup past the limit is refused, and the reason names the chain."""
    import time
    from datetime import timedelta

    from django.utils import timezone

    from portal.core.agent_sync import agent_sync
    from workers.protocol import AttemptResult, NodeInfo, RunningAttempt, SyncRequest

    gpus = tuple({"index": i, "model": "V100", "memory_mb": 16384} for i in range(3))
    info = NodeInfo(kind="gpu", cores=8, memory_mb=1024, backend="virtual", gpus=gpus)
    seq = iter(range(1, 100))

    def sync(**fields):
        return agent_sync(
            SyncRequest(node="g1", instance="t", seq=next(seq), sent_at=time.time(), **fields)
        )

    sync(info=info)
    node = Node.objects.get(name="g1")
    job = Job.objects.create(
        owner=alice, name="elastic", command="true", gpus=1, gpu_memory_mb=4000,
        elastic_min_workers=1, elastic_max_workers=3, time_limit_s=600,
        elastic_state=measured_state(1, 10.0),
    )  # fmt: skip
    job_transition(job, JobState.SCHEDULED, actor="t")
    first = Placement.objects.create(job=job, attempt=1, node=node, gpu_memory_mb=4000, policy="t")
    first.gpus.set([node.gpus.get(index=0)])
    PlacementPart.objects.create(placement=first, node=node, gpu_indices=[0])
    assert [a.time_limit_s for a in sync().desired] == [600.0]
    sync(running=(RunningAttempt(job.pk, 1, "running", time.time(), 4242),))
    job.refresh_from_db()
    assert job.state == "RUNNING"
    # attempt 1 has run 200 s when the job grows to 2 workers
    Placement.objects.filter(pk=first.pk).update(started_at=timezone.now() - timedelta(seconds=200))

    def grow(to: int) -> dict:
        action = Action(
            ActionKind.SET_WORKERS, str(job.pk), "elastic", f"probe {to}",
            value={"workers_from": to - 1, "workers": to, "efficiency": None, "local_batch": None},
        )  # fmt: skip
        assert elastic_change_propose(job.pk, action, actor="scheduler") is not None
        return report(job, to - 1, 10.0, checkpointed=True)

    assert grow(2)["regroup"]
    sync(results=(AttemptResult(job.pk, 1, "killed", time.time(), -15, "regrouped"),))
    (spec,) = [a for a in sync().desired if a.attempt == 2]
    assert 395 <= spec.time_limit_s <= 400  # 600 s less attempt 1's 200 s
    sync(running=(RunningAttempt(job.pk, 2, "running", time.time(), 4243),))
    # attempt 2 has run 450 s: 650 s in all, past the limit: no new group
    second = job.placements.get(attempt=2)
    Placement.objects.filter(pk=second.pk).update(
        started_at=timezone.now() - timedelta(seconds=450)
    )
    assert not grow(3)["regroup"]
    refused = ElasticChange.objects.get(job=job, workers_to=3).refused
    assert refused == "the job's time limit (00:10:00, counted across its regroups) is reached"
    # the runner stops attempt 2 at its share: the reason names the job's limit and the chain
    detail = "time limit 00:06:40 reached: the runner stopped the job (killed by SIGTERM)"
    sync(results=(AttemptResult(job.pk, 2, "time_limit", time.time(), -15, detail),))
    job.refresh_from_db()
    assert job.state == "FAILED" and job.end_label == "time limit"
    assert job.failure_reason.startswith("time limit 00:10:00 reached over attempts 1-2")
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "per attempt, regroups included" in page


def test_a_step_up_gives_way_to_a_job_that_started_waiting_after_it_was_proposed(alice, bob):
    job = running_elastic_job(alice, gpus=1, node_gpus=4)  # 3 idle V100
    job.elastic_state = measured_state(1, 10.0)
    job.save()
    early = Job.objects.create(owner=bob, name="early", command="true", gpus=2)  # seen by it

    def propose(to: int) -> ElasticChange:
        action = Action(
            ActionKind.SET_WORKERS, str(job.pk), "elastic", f"probe {to}",
            value={"workers_from": len(active_gpus(job)), "workers": to,
                   "efficiency": None, "local_batch": None},
        )  # fmt: skip
        change = elastic_change_propose(job.pk, action, actor="scheduler")
        assert change is not None
        return change

    change = propose(3)
    one = Job.objects.create(owner=bob, name="one", command="true", gpus=1)  # fits beside it
    assert report(job, 1, 10.0, checkpointed=True)["regroup"]  # neither blocks the step up
    change.refresh_from_db()
    assert change.applied and len(active_gpus(job)) == 3
    assert early.state == one.state == "PENDING"
    Job.objects.filter(pk__in=[early.pk, one.pk]).delete()

    job.refresh_from_db()
    change = propose(4)
    late = Job.objects.create(owner=bob, name="late", command="true", gpus=1)
    reply = report(job, 3, 10.0, checkpointed=True)
    assert not reply["regroup"] and len(active_gpus(job)) == 3
    change.refresh_from_db()
    assert not change.applied
    assert change.refused == (
        f"job {late.pk} started waiting for V100 GPUs after this step up was proposed and "
        "would not fit beside it; the policy decides again with it"
    )
    job.refresh_from_db()
    assert not job.elastic_state["in_transition"]  # the engine goes on
