"""The live scheduling cycle: snapshot -> policy -> placements and actions, written safely."""

from __future__ import annotations

import random

import pytest

from portal.core.models import Gpu, Job, JobEvent, Node, Placement, PolicySettings
from portal.core.scheduling import build_snapshot, run_cycle
from portal.core.services import job_cancel, job_transition
from portal.core.states import JobState
from scheduler.domain import (
    Action,
    ActionKind,
    ClusterState,
    Decision,
    Plan,
    SharingMode,
)
from scheduler.domain import (
    Placement as DomainPlacement,
)
from scheduler.domain import PlacementPart as DomainPart
from scheduler.policies import registry
from scheduler.policies.base import Policy

pytestmark = pytest.mark.django_db


def make_node(name: str, gpus: int = 2, memory_mb: int = 12288, kind: str = "gpu") -> Node:
    node = Node.objects.create(name=name, kind=kind, cores=8, memory_mb=65536)
    for i in range(gpus):
        Gpu.objects.create(
            node=node,
            index=i,
            model="TitanXp",
            memory_mb=memory_mb,
            uuid=f"GPU-{name}-{i}",
            sharing_modes=["exclusive", "time_slicing", "mps"],
        )
    return node


def submit(owner, name: str, gpus: int = 1, gpu_memory_mb: int | None = 4000, **kw) -> Job:
    return Job.objects.create(
        owner=owner, name=name, command="true", gpus=gpus, gpu_memory_mb=gpu_memory_mb, **kw
    )


def use_policy(name: str, **params) -> None:
    PolicySettings.objects.all().delete()
    PolicySettings.objects.create(name="test", policy=name, params=params, active=True)


def test_snapshot_reflects_rows(alice):
    node = make_node("g1")
    make_node("c1", gpus=0, kind="cpu")
    running = submit(alice, "running", gpu_memory_mb=5000)
    job_transition(running, JobState.SCHEDULED, actor="test")
    p = Placement.objects.create(job=running, node=node, gpu_memory_mb=5000, policy="t", cpus=2)
    p.gpus.set([node.gpus.get(index=1)])
    pending = submit(alice, "pending")

    snap = build_snapshot()
    state = snap.state
    assert [j.id for j in state.pending] == [str(pending.pk)]
    g1 = state.node("g1")
    assert g1.free_cores == 6
    assert g1.gpus[0].idle and g1.gpus[0].free_memory_mb == 12288
    assert g1.gpus[1].job_ids == (str(running.pk),)
    assert g1.gpus[1].free_memory_mb == 12288 - 5000
    assert state.node("c1").kind == "cpu"
    assert [r.job.id for r in state.running] == [str(running.pk)]
    assert snap.running_nodes == {running.pk: {"g1"}}


def test_a_profiled_jobs_spec_in_the_snapshot_is_the_adapters(alice):
    """The snapshot converts each profile once and each job without it (``_without_profile``);
    the job's spec must still carry every field the adapter gives it: its requeue count
    (hetero_srtf's preemption bound) and what it died beside (``oom_with``) among them."""
    from dataclasses import replace

    from portal.core.adapters import job_to_domain
    from portal.core.models import ApplicationProfile, ProfileGpuTime

    profile = ApplicationProfile.objects.create(name="resnet", kind="dl-train", status="approved")
    ProfileGpuTime.objects.create(profile=profile, gpu_model="TitanXp", time_s=600.0)
    job = submit(
        alice, "profiled", profile=profile, requeue_count=2, oom_requeues=1, oom_with=["bert"],
        time_limit_s=3600, priority=3, params={"job_type": "ResNet-18"},
    )  # fmt: skip
    (spec,) = build_snapshot().state.pending
    direct = job_to_domain(Job.objects.get(pk=job.pk))
    assert spec.oom_with == frozenset({"bert"}) and spec.params["preemptions"] == 1
    assert replace(spec, arrival_s=0.0) == replace(direct, arrival_s=0.0)


def test_fifo_cycle_places_in_order_and_explains_the_rest(alice):
    make_node("g1", gpus=2)
    use_policy("fifo")
    jobs = [submit(alice, f"j{i}") for i in range(3)]

    result = run_cycle()

    assert result.placed == [jobs[0].pk, jobs[1].pk]
    for job in jobs[:2]:
        job.refresh_from_db()
        assert job.state == JobState.SCHEDULED
        placement = job.current_placement
        assert placement.policy == "fifo" and placement.explanation
        assert placement.gpus.count() == 1
        assert job.events.filter(to_state="SCHEDULED", actor="scheduler").exists()
    used = {j.current_placement.gpus.get().index for j in jobs[:2]}
    assert used == {0, 1}
    jobs[2].refresh_from_db()
    assert jobs[2].state == JobState.PENDING
    assert jobs[2].waiting_reason  # fifo says why it waits

    # The next cycle places nothing new (no double placement) and keeps the reason.
    again = run_cycle()
    assert again.placed == []
    assert Placement.objects.filter(active=True).count() == 2


def test_cycle_frees_capacity_when_a_job_ends(alice):
    make_node("g1", gpus=1)
    use_policy("fifo")
    first, second = submit(alice, "a"), submit(alice, "b")
    run_cycle()
    first.refresh_from_db()
    job_transition(first, JobState.RUNNING, actor="node:g1")
    job_transition(first, JobState.COMPLETED, actor="node:g1", exit_code=0)
    assert run_cycle().placed == [second.pk]


def test_down_node_gets_nothing(alice):
    node = make_node("g1")
    node.status = Node.Status.DOWN
    node.save()
    use_policy("fifo")
    job = submit(alice, "a")
    assert run_cycle().placed == []
    job.refresh_from_db()
    assert job.state == JobState.PENDING


class _GreedyBadPolicy(Policy):
    """Puts every pending job on GPU 0 of the first node, exclusively: a faulty policy."""

    name = "greedy_bad"

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        node = state.nodes[0].name
        return Plan(
            decisions=tuple(
                Decision(DomainPlacement(j.id, node, (0,), SharingMode.EXCLUSIVE), self.name, "x")
                for j in state.pending
            )
        )


class _GangTwo(Policy):
    """Puts every pending job on GPUs 0 and 1 of the first two nodes (a gang): a policy
    producing gang decisions, as the framework will."""

    name = "gang_two"

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        first, second = state.nodes[0].name, state.nodes[1].name
        return Plan(
            decisions=tuple(
                Decision(
                    DomainPlacement(
                        j.id,
                        first,
                        (0, 1),
                        SharingMode.EXCLUSIVE,
                        cpus=2,
                        more=(DomainPart(second, (0, 1), 2),),
                    ),
                    self.name,
                    "gang",
                )
                for j in state.pending
            )
        )


class _PauseAll(Policy):
    name = "pause_all"

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        return Plan(
            actions=tuple(
                Action(
                    ActionKind.RESUME if r.paused else ActionKind.PAUSE,
                    r.job.id,
                    self.name,
                    "step 3 needs 2.8 GB",
                )
                for r in state.running
            )
        )


@pytest.fixture
def extra_policies(monkeypatch):
    monkeypatch.setitem(registry.POLICIES, "greedy_bad", f"{__name__}:_GreedyBadPolicy")
    monkeypatch.setitem(registry.POLICIES, "pause_all", f"{__name__}:_PauseAll")
    monkeypatch.setitem(registry.POLICIES, "gang_two", f"{__name__}:_GangTwo")


def test_a_faulty_policy_cannot_overcommit_a_gpu(alice, extra_policies):
    make_node("g1", gpus=1)
    use_policy("greedy_bad")
    a, b = submit(alice, "a"), submit(alice, "b")
    result = run_cycle()
    assert result.placed == [a.pk]
    assert b.pk in result.refused and "exclusively" in result.refused[b.pk]
    b.refresh_from_db()
    assert b.state == JobState.PENDING and "refused" in b.waiting_reason
    assert Placement.objects.filter(active=True).count() == 1


def test_a_cancelled_job_is_not_placed(alice, extra_policies, monkeypatch):
    make_node("g1", gpus=2)
    use_policy("fifo")
    job = submit(alice, "a")
    from portal.core import scheduling

    real = scheduling.build_snapshot

    def snapshot_then_cancel(*args, **kwargs):
        snap = real(*args, **kwargs)
        job_cancel(job, actor="user:alice")  # the user cancels while the policy thinks
        return snap

    monkeypatch.setattr(scheduling, "build_snapshot", snapshot_then_cancel)
    assert run_cycle().placed == []
    assert not Placement.objects.filter(job=job).exists()


def test_pause_and_resume_actions_write_the_timeline(alice, extra_policies):
    node = make_node("g1")
    use_policy("pause_all")
    job = submit(alice, "a")
    job_transition(job, JobState.SCHEDULED, actor="t")
    p = Placement.objects.create(job=job, node=node, gpu_memory_mb=4000, policy="t")
    p.gpus.set([node.gpus.get(index=0)])
    job_transition(job, JobState.RUNNING, actor="t")

    result = run_cycle()
    job.refresh_from_db()
    assert result.actions == [("pause", job.pk)]
    assert job.state == JobState.PAUSED
    event = JobEvent.objects.filter(job=job, to_state="PAUSED").get()
    assert "step 3 needs 2.8 GB" in event.message and event.actor == "scheduler"

    run_cycle()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING


def test_each_decision_is_the_jobs_next_numbered_attempt_with_its_parts(alice):
    make_node("g1")
    use_policy("fifo")
    job = submit(alice, "a")
    run_cycle()
    job_transition(job, JobState.PENDING, actor="scheduler", message="preempted")
    run_cycle()
    attempts = list(Placement.objects.filter(job=job).order_by("attempt"))
    assert [(a.attempt, a.active, a.outcome) for a in attempts] == [
        (1, False, "requeued"),
        (2, True, ""),
    ]
    assert attempts[0].end_reason == "preempted"
    (part,) = attempts[1].parts.all()
    assert (part.node.name, part.node_rank, part.gpu_indices, part.cpus) == ("g1", 0, [0], 1)


def test_a_gang_decision_is_written_whole_on_every_node(alice, extra_policies):
    make_node("g1")
    make_node("g2")
    use_policy("gang_two")
    job = submit(alice, "a", gpus=4)
    assert run_cycle().placed == [job.pk]
    placement = Placement.objects.get(job=job)
    parts = [(p.node.name, p.node_rank, p.gpu_indices, p.cpus) for p in placement.parts.all()]
    assert parts == [("g1", 0, [0, 1], 2), ("g2", 1, [0, 1], 2)]
    assert sorted((g.node.name, g.index) for g in placement.gpus.all()) == [
        ("g1", 0),
        ("g1", 1),
        ("g2", 0),
        ("g2", 1),
    ]
    event = JobEvent.objects.filter(job=job, to_state="SCHEDULED").get()
    assert "g1 GPU 0,1 (exclusive) + g2 GPU 0,1 (exclusive)" in event.message
    # The running gang holds cores and GPUs on both nodes in the next snapshot.
    snap = build_snapshot()
    assert snap.state.node("g2").free_cores == 6 and snap.running_nodes[job.pk] == {"g1", "g2"}
    (running,) = snap.state.running
    assert running.placement.nodes == ("g1", "g2") and running.placement.gpu_count == 4


def test_a_gang_that_does_not_fit_on_one_of_its_nodes_is_not_written_at_all(alice, extra_policies):
    make_node("g1")
    g2 = make_node("g2")
    use_policy("gang_two")
    busy = submit(alice, "busy")
    job_transition(busy, JobState.SCHEDULED, actor="t")
    p = Placement.objects.create(job=busy, node=g2, gpu_memory_mb=100, policy="t")
    p.gpus.set([g2.gpus.get(index=1)])
    job = submit(alice, "gang", gpus=4)
    result = run_cycle()
    assert result.placed == [] and "GPU g2/1 is held exclusively" in result.refused[job.pk]
    assert not Placement.objects.filter(job=job).exists()
    assert Placement.objects.filter(active=True).count() == 1  # nothing of the gang on g1


def test_unknown_policy_name_is_reported_and_fifo_runs_instead(alice):
    make_node("g1")
    use_policy("no_such_policy")
    job = submit(alice, "a")
    result = run_cycle()
    assert result.placed == [job.pk] and result.fallback == "fifo"
    row = PolicySettings.objects.get(active=True)
    assert "unknown policy 'no_such_policy'" in row.runtime_error


def test_the_fairness_cap_reads_the_job_history_live(alice):
    """The live loop builds ``hetero_srtf`` afresh each cycle, so the jobs-present average its
    fairness cap reads comes from the job history in the snapshot (``present_job_s``): a job
    that waited 20,000 s beside one other job goes before 20 short jobs that just arrived,
    though counting the 21 present now would put the shortest first (issue 24)."""
    from datetime import timedelta

    from django.utils import timezone

    from portal.core.models import ApplicationProfile, ProfileGpuTime

    make_node("g1", gpus=1)
    now = timezone.now()
    long_p = ApplicationProfile.objects.create(name="long", kind="dl-train", status="approved")
    ProfileGpuTime.objects.create(profile=long_p, gpu_model="TitanXp", time_s=1000.0)
    short_p = ApplicationProfile.objects.create(name="short", kind="dl-train", status="approved")
    ProfileGpuTime.objects.create(profile=short_p, gpu_model="TitanXp", time_s=200.0)
    # The job that held the GPU from 20,000 s ago until a second ago.
    hog = submit(alice, "hog")
    Job.objects.filter(pk=hog.pk).update(
        state=JobState.COMPLETED,
        submitted_at=now - timedelta(seconds=20_000),
        finished_at=now - timedelta(seconds=1),
    )
    b = submit(alice, "b", profile=long_p)
    Job.objects.filter(pk=b.pk).update(submitted_at=now - timedelta(seconds=20_000))
    shorts = [submit(alice, f"s{i}", profile=short_p) for i in range(20)]

    snap = build_snapshot(now)
    present = snap.state.present_job_s
    assert present is not None
    # b: two jobs present for 19,999 s, then b and the shorts (arrived just now).
    assert present[str(b.pk)] == pytest.approx(2 * 19_999 + 1, abs=2.0)
    assert present[str(shorts[0].pk)] == pytest.approx(0.0, abs=21 * 2.0)
    assert str(hog.pk) not in present  # ended: asked about for no one

    # Without the history a fresh policy counts the moment: a short job first.
    from dataclasses import replace

    blind = registry.build_policy("hetero_srtf", {"aging": 0.0, "pack_threshold": 0})
    plan = blind.schedule(replace(snap.state, present_job_s=None), random.Random(0))
    assert [d.placement.job_id for d in plan.decisions] != [str(b.pk)]

    use_policy("hetero_srtf", aging=0.0, pack_threshold=0, ftf_cap=2.0)
    result = run_cycle(seed=0)
    assert result.placed == [b.pk]


def test_a_job_of_unknown_length_is_ranked_by_its_attained_service_live(alice):
    """Jobs without a profile declare no length: the live loop hands ``hetero_srtf`` the
    seconds each has run over its attempts (``attained_s``, from the placements), and a job
    that has held the only GPU for five hours yields to one that just arrived (least attained
    service); under ``unknown_lengths: fifo`` it keeps the GPU (issue 24)."""
    from datetime import timedelta

    from django.utils import timezone

    node = make_node("g1", gpus=1)
    now = timezone.now()
    old = submit(alice, "old")
    job_transition(old, JobState.SCHEDULED, actor="t")
    # an earlier attempt of one hour, then the current one since four hours ago
    first = Placement.objects.create(job=old, node=node, gpu_memory_mb=4000, policy="t")
    Placement.objects.filter(pk=first.pk).update(
        active=False,
        started_at=now - timedelta(hours=6),
        released_at=now - timedelta(hours=5),
        outcome="requeued",
    )
    current = Placement.objects.create(job=old, node=node, gpu_memory_mb=4000, policy="t")
    current.gpus.set([node.gpus.get(index=0)])
    Placement.objects.filter(pk=current.pk).update(started_at=now - timedelta(hours=4))
    job_transition(old, JobState.RUNNING, actor="t")
    new = submit(alice, "new")

    # Three jobs of another type completed in 10 minutes each.
    from portal.core.models import JobObservation

    for i in range(3):
        done = submit(alice, f"done{i}")
        Job.objects.filter(pk=done.pk).update(state=JobState.COMPLETED, finished_at=now)
        JobObservation.objects.create(
            job=done, kind="completed", job_type="sweep", at=now, window_s=600.0 + i
        )

    snap = build_snapshot(now)
    attained = snap.state.attained_s
    assert attained is not None
    assert attained[str(old.pk)] == pytest.approx(5 * 3600.0, abs=1.0)
    assert attained[str(new.pk)] == 0.0
    # The knowledge holds every type's recent completions: the length history of a job
    # whose own type has none.
    knowledge = snap.state.knowledge
    assert knowledge is not None
    lengths, what, typed = knowledge.duration_samples(f"#{new.pk}", str(alice.pk))
    assert lengths == (600.0, 601.0, 602.0) and "of any type" in what and not typed

    use_policy("hetero_srtf", pack_threshold=0, unknown_lengths="fifo")
    assert run_cycle(seed=0).actions == []
    use_policy("hetero_srtf", pack_threshold=0)
    result = run_cycle(seed=0)
    assert result.actions == [("requeue", old.pk)]
    old.refresh_from_db()
    assert old.state == JobState.PENDING
