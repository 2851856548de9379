"""Sharing data through the portal: job owners and MIG layouts reach the policies."""

from __future__ import annotations

import pytest

from portal.core.adapters import gpu_to_domain, job_to_domain
from portal.core.models import (
    ApplicationProfile,
    Gpu,
    Job,
    Node,
    Placement,
    PolicySettings,
    ProfileGpuTime,
)
from portal.core.scheduling import build_snapshot, run_cycle
from portal.core.services import job_transition
from portal.core.states import JobState

pytestmark = pytest.mark.django_db


@pytest.fixture
def node():
    node = Node.objects.create(name="v1", kind="gpu", cores=8, memory_mb=65536)
    Gpu.objects.create(
        node=node,
        index=0,
        model="V100",
        memory_mb=16160,
        uuid="GPU-v1-0",
        sharing_modes=["exclusive", "mps"],
    )
    return node


@pytest.fixture
def resnet():
    profile = ApplicationProfile.objects.create(
        name="resnet", kind="dl-train", status="approved", gpu_memory_max_mb=2000, cm_ratio=11.0
    )
    ProfileGpuTime.objects.create(profile=profile, gpu_model="V100", time_s=100)
    return profile


def _job(owner, name, profile):
    # These jobs allow sharing (docs/jobs.md: the default is GPUs of their own).
    return Job.objects.create(
        owner=owner, name=name, command="true", gpus=1, gpu_memory_mb=2000, profile=profile,
        sharing="allowed",
    )  # fmt: skip


def test_the_owner_reaches_the_job_spec(alice, resnet):
    job = _job(alice, "mine", resnet)
    assert job_to_domain(job).owner == str(alice.pk)


def test_the_mig_layout_reaches_the_gpu_state():
    node = Node.objects.create(name="a1", kind="gpu", cores=8, memory_mb=65536)
    gpu = Gpu.objects.create(
        node=node, index=0, model="A30", memory_mb=24576, mig_layout=["2g.12gb", "1g.6gb"]
    )
    assert gpu_to_domain(gpu).mig_layout == ("2g.12gb", "1g.6gb")
    assert build_snapshot().state.node("a1").gpus[0].mig_layout == ("2g.12gb", "1g.6gb")


def test_a_live_cycle_keeps_mps_to_one_user(alice, bob, node, resnet):
    running = _job(alice, "running", resnet)
    job_transition(running, JobState.SCHEDULED, actor="test")
    placement = Placement.objects.create(
        job=running, node=node, gpu_memory_mb=2000, policy="t", sharing_mode="mps"
    )
    placement.gpus.set([node.gpus.get()])
    Gpu.objects.filter(node=node).update(current_mode="mps")
    theirs = _job(bob, "theirs", resnet)
    mine = _job(alice, "mine", resnet)
    snapshot = build_snapshot()
    assert {j.id: j.owner for j in snapshot.state.pending} == {
        str(theirs.pk): str(bob.pk),
        str(mine.pk): str(alice.pk),
    }
    PolicySettings.objects.create(
        name="t", policy="binpack", params={"max_jobs_per_gpu": 3}, active=True
    )
    run_cycle()
    theirs.refresh_from_db()
    mine.refresh_from_db()
    assert mine.state == JobState.SCHEDULED
    assert mine.placements.get(active=True).sharing_mode == "mps"
    assert theirs.state == JobState.PENDING
    assert "another user's jobs" in theirs.waiting_reason


def test_the_thread_limit_follows_the_architecture(node):
    v100 = gpu_to_domain(node.gpus.get())
    assert v100.spec.mps_thread_limit  # Volta: from the catalogue
    Gpu.objects.filter(pk=node.gpus.get().pk).update(architecture="Pascal")
    assert not gpu_to_domain(node.gpus.get()).spec.mps_thread_limit  # the row says Pascal
