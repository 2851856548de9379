"""Projects and quotas through the live scheduling cycle (real PostgreSQL): guarantees under
contention, borrowing while a project is idle, reclaim when it returns, fair share."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.core.models import Gpu, Job, Node, Placement, PolicySettings
from portal.core.scheduling import build_snapshot, run_cycle
from portal.core.services import job_submit, job_transition
from portal.core.states import JobState
from portal.teams.models import Membership, Project, ProjectQuota

pytestmark = pytest.mark.django_db


def _cluster() -> None:
    """Two virtual nodes with two V100 each."""
    for name in ("v1", "v2"):
        node = Node.objects.create(name=name, kind="gpu", cores=8, memory_mb=65536)
        for i in range(2):
            Gpu.objects.create(
                node=node, index=i, model="V100", memory_mb=16384, uuid=f"{name}-{i}"
            )


def _projects(alice, bob, *, guaranteed: int = 2, borrow: int | None = 2) -> None:
    for name, user in (("alpha", alice), ("beta", bob)):
        project = Project.objects.create(name=name)
        Membership.objects.create(project=project, user=user)
        ProjectQuota.objects.create(
            project=project, gpu_model="V100", guaranteed_gpus=guaranteed, borrow_limit_gpus=borrow
        )
    PolicySettings.objects.all().delete()
    PolicySettings.objects.create(
        name="t", policy="quota", params={"base_params": {"backfill": True}}, active=True
    )


def _submit(user, project: str, n: int) -> list[Job]:
    return [
        job_submit(
            user, name=f"{project}-{i}", command="true", gpus=1, gpu_memory_mb=1000, project=project
        )[0]
        for i in range(n)
    ]


def _gpus_by_project() -> dict[str, int]:
    out: dict[str, int] = {}
    for p in Placement.objects.filter(active=True).select_related("job__project"):
        out[p.job.project.name] = out.get(p.job.project.name, 0) + p.gpus.count()
    return out


def _start(jobs: list[Job]) -> None:
    """The agents report them running, a minute apart (the last one is the newest)."""
    base = timezone.now() - timedelta(hours=1)
    for i, job in enumerate(jobs):
        job_transition(job, JobState.RUNNING, actor="node:test", expected=JobState.SCHEDULED)
        at = base + timedelta(minutes=i)
        Job.objects.filter(pk=job.pk).update(started_at=at)
        Placement.objects.filter(job=job, active=True).update(started_at=at)


def test_each_project_gets_its_guarantee_under_contention(alice, bob):
    _cluster()
    _projects(alice, bob)
    _submit(alice, "alpha", 4)  # alpha asks for the whole cluster first
    bob_jobs = _submit(bob, "beta", 4)
    result = run_cycle(seed=0)
    assert len(result.placed) == 4
    assert _gpus_by_project() == {"alpha": 2, "beta": 2}
    waiting = Job.objects.get(pk=bob_jobs[3].pk)
    assert waiting.state == JobState.PENDING
    assert "past its guarantee: it would borrow" in waiting.waiting_reason


def test_idle_capacity_is_lent_then_reclaimed_newest_first(alice, bob):
    _cluster()
    _projects(alice, bob)
    alpha = _submit(alice, "alpha", 4)
    run_cycle(seed=0)
    assert _gpus_by_project() == {"alpha": 4}  # 2 guaranteed + 2 borrowed: beta is idle
    borrowed = Placement.objects.filter(job__in=alpha, explanation__contains="borrows").count()
    assert borrowed == 2
    _start(alpha)

    beta = _submit(bob, "beta", 2)  # beta returns
    result = run_cycle(seed=0)
    requeued = sorted(job_id for kind, job_id in result.actions if kind == "requeue")
    assert requeued == sorted([alpha[3].pk, alpha[2].pk])  # the newest two
    for job in beta:
        job.refresh_from_db()
        assert job.state == JobState.PENDING
        assert "reclaiming 1 V100 borrowed by project alpha" in job.waiting_reason
    for job in alpha[2:]:
        job.refresh_from_db()
        assert job.state == JobState.PENDING
        assert job.events.filter(message__contains="project beta reclaims them").exists()

    result = run_cycle(seed=0)  # the next cycle: beta's guarantee is back
    assert sorted(result.placed) == sorted(j.pk for j in beta)
    assert _gpus_by_project() == {"alpha": 2, "beta": 2}
    assert not result.actions


def test_borrowing_limit_is_a_waiting_reason(alice, bob):
    _cluster()
    _projects(alice, bob, guaranteed=1, borrow=1)
    alpha = _submit(alice, "alpha", 3)
    run_cycle(seed=0)
    assert _gpus_by_project() == {"alpha": 2}
    last = Job.objects.get(pk=alpha[2].pk)
    assert last.waiting_reason == (
        "waiting for quota: project alpha at its guaranteed 1 V100; borrowing limit reached "
        "(1 borrowed of 1)"
    )


def test_fair_share_orders_equal_jobs_by_past_usage(alice, bob):
    node = Node.objects.create(name="v1", kind="gpu", cores=8, memory_mb=65536)
    Gpu.objects.create(node=node, index=0, model="V100", memory_mb=16384, uuid="v1-0")
    lab = Project.objects.create(name="lab")
    Membership.objects.create(project=lab, user=alice)
    Membership.objects.create(project=lab, user=bob)
    PolicySettings.objects.all().delete()
    PolicySettings.objects.create(name="t", policy="quota", params={}, active=True)
    # alice ran a 1-GPU job for two hours this morning; bob nothing.
    old = job_submit(alice, name="old", command="true", gpus=1, gpu_memory_mb=1000, project="lab")[
        0
    ]
    run_cycle(seed=0)
    _start([old])
    hours_ago = timezone.now() - timedelta(hours=3)
    Placement.objects.filter(job=old).update(started_at=hours_ago)
    job_transition(old, JobState.COMPLETED, actor="node:test")
    Placement.objects.filter(job=old).update(released_at=hours_ago + timedelta(hours=2))
    usage = build_snapshot().state.accounts.usage
    assert usage[("lab", str(alice.pk))] > 6000  # about 7200 GPU-seconds, barely decayed
    first = job_submit(alice, name="a", command="true", gpus=1, gpu_memory_mb=1000, project="lab")
    second = job_submit(bob, name="b", command="true", gpus=1, gpu_memory_mb=1000, project="lab")
    result = run_cycle(seed=0)
    assert result.placed == [second[0].pk]  # bob's job, submitted later, goes first
    assert Job.objects.get(pk=first[0].pk).state == JobState.PENDING
