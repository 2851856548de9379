"""EASY reservations (the framework's ``reserve``) through the portal's scheduling cycle: the
active policy's parameter, the predicted ends of running jobs from their profiles and start
times, and the reasons stored on the waiting jobs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.core.models import (
    ApplicationProfile,
    Gpu,
    Job,
    Node,
    Placement,
    PlacementPart,
    PolicySettings,
    ProfileGpuTime,
)
from portal.core.scheduling import run_cycle
from portal.core.services import job_transition
from portal.core.states import JobState

pytestmark = pytest.mark.django_db


def _profile(name: str, seconds: float) -> ApplicationProfile:
    profile = ApplicationProfile.objects.create(name=name, kind="dl-train", status="approved")
    ProfileGpuTime.objects.create(profile=profile, gpu_model="V100", time_s=seconds)
    return profile


def _running(owner, node: Node, indices: list[int], profile, started_s_ago: float) -> Job:
    job = Job.objects.create(
        owner=owner, name=f"run-{indices}", command="true", gpus=len(indices), profile=profile,
        gpu_memory_mb=1000,
    )  # fmt: skip
    job_transition(job, JobState.SCHEDULED, actor="t")
    placement = Placement.objects.create(job=job, node=node, gpu_memory_mb=1000, policy="t")
    placement.gpus.set(list(node.gpus.filter(index__in=indices)))
    PlacementPart.objects.create(placement=placement, node=node, gpu_indices=indices)
    job_transition(job, JobState.RUNNING, actor="t")
    started = timezone.now() - timedelta(seconds=started_s_ago)
    Job.objects.filter(pk=job.pk).update(started_at=started)
    Placement.objects.filter(pk=placement.pk).update(started_at=started)
    return job


@pytest.mark.parametrize("reserve", [False, True])
def test_a_waiting_gang_holds_a_reservation_a_long_job_may_not_delay(alice, bob, reserve):
    node = Node.objects.create(name="g1", kind="gpu", cores=16, memory_mb=65536)
    for i in range(4):
        Gpu.objects.create(node=node, index=i, model="V100", memory_mb=16384, uuid=f"GPU-g1-{i}")
    PolicySettings.objects.create(
        name="bp", policy="binpack", params={"reserve": reserve}, active=True
    )
    hour = _profile("hour", 3600.0)
    _running(alice, node, [0, 1], hour, started_s_ago=600)
    _running(alice, node, [2], hour, started_s_ago=1200)
    big = Job.objects.create(
        owner=alice, name="big", command="true", gpus=4, profile=hour, gpu_memory_mb=1000
    )
    long = Job.objects.create(
        owner=bob, name="long", command="true", gpus=1, profile=_profile("two-hours", 7200.0),
        gpu_memory_mb=1000,
    )  # fmt: skip
    run_cycle()
    big.refresh_from_db()
    long.refresh_from_db()
    if not reserve:  # the long job takes the idle GPU: the big one waits for it as well
        assert long.state == "SCHEDULED"
        assert "reservation" not in big.waiting_reason
        return
    assert long.state == "PENDING"
    assert big.waiting_reason.startswith(
        "holds a reservation of 4 V100 on g1/gpu0,1,2,3, predicted idle in about 50 min"
    ), big.waiting_reason
    assert long.waiting_reason.startswith(f"would delay job {big.pk}'s reservation"), (
        long.waiting_reason
    )
    assert "predicted to run about 2.0 h" in long.waiting_reason
