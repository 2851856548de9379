"""GPU out-of-memory beside another job on a shared GPU (portal.core.oom): the node reports the
exit and the log tail; the job is requeued with what it died beside, the scheduler keeps it
away from that type, and it fails only on a GPU of its own or after its requeues."""

from __future__ import annotations

import time

import pytest

from portal.core.agent_sync import agent_sync
from portal.core.models import (
    ApplicationProfile,
    Gpu,
    Job,
    Node,
    Placement,
    PlacementPart,
    PolicySettings,
)
from portal.core.oom import gpu_oom_line
from portal.core.scheduling import run_cycle
from workers.protocol import AttemptResult, NodeInfo, RunningAttempt, SyncRequest

pytestmark = pytest.mark.django_db

TORCH_OOM = (
    'epoch 3\nTraceback (most recent call last):\n  File "train.py", line 9\n'
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 24.00 GiB "
    "total capacity)\n"
)


class _Node:
    def __init__(self) -> None:
        self.seq = 0
        self.running: dict[int, RunningAttempt] = {}  # what the agent runs: every sync says all
        gpus = tuple({"index": i, "model": "A30", "memory_mb": 24576} for i in range(2))
        self.sync(
            info=NodeInfo(kind="gpu", cores=16, memory_mb=65536, backend="virtual", gpus=gpus)
        )
        self.node = Node.objects.get(name="g1")

    def sync(self, **fields):
        self.seq += 1
        fields.setdefault("running", tuple(self.running.values()))
        return agent_sync(
            SyncRequest(node="g1", instance="t", seq=self.seq, sent_at=time.time(), **fields)
        )

    def run(self, owner, name: str, gpu: int, mode: str, profile=None) -> Job:
        job = Job.objects.create(
            owner=owner, name=name, command="true", gpus=1, gpu_memory_mb=4000, state="SCHEDULED",
            profile=profile,
        )  # fmt: skip
        placement = Placement.objects.create(
            job=job, attempt=1, node=self.node, sharing_mode=mode, gpu_memory_mb=4000, policy="t"
        )
        placement.gpus.add(Gpu.objects.get(node=self.node, index=gpu))
        Gpu.objects.filter(node=self.node, index=gpu).update(current_mode=mode)
        PlacementPart.objects.create(placement=placement, node=self.node, gpu_indices=[gpu])
        self.running[job.pk] = RunningAttempt(job.pk, 1, "running", time.time(), 4000 + job.pk)
        self.sync()
        return job

    def exit(self, job: Job, code: int, tail: str, attempt: int = 1) -> Job:
        result = AttemptResult(job.pk, attempt, "exited", time.time(), code, f"exit code {code}",
                               log_tail=tail)  # fmt: skip
        self.running.pop(job.pk, None)
        self.sync(results=(result,))
        job.refresh_from_db()
        return job


def test_the_messages_of_the_frameworks_are_recognised():
    assert gpu_oom_line(TORCH_OOM).startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert gpu_oom_line("2026 W tensorflow OOM when allocating tensor with shape[512,512]")
    assert gpu_oom_line("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory")
    assert gpu_oom_line("CUDA error: cudaErrorMemoryAllocation") is not None
    assert gpu_oom_line("MemoryError: host ran out\nKilled") is None
    assert gpu_oom_line(None) is None


def test_an_oom_beside_another_job_requeues_and_the_scheduler_keeps_them_apart(alice, bob):
    node = _Node()
    resnet = ApplicationProfile.objects.create(name="resnet", kind="dl-train", status="approved")
    # one owner: MPS serves one user per GPU, so only the OOM can keep the victim off GPU 0
    neighbour = node.run(alice, "neighbour", 0, "mps", profile=resnet)
    victim = node.run(alice, "victim", 0, "mps")
    node.run(bob, "other", 1, "exclusive")  # GPU 1 is taken: only GPU 0 could take the victim
    victim = node.exit(victim, 1, TORCH_OOM)
    assert victim.state == "PENDING" and victim.exit_code is None
    assert victim.oom_with == ["resnet"] and victim.oom_requeues == 1
    event = victim.events.filter(to_state="PENDING").get()
    assert f"out of GPU memory beside job {neighbour.pk} (resnet)" in event.message
    assert "requeued (1 of 3); it will not be placed beside resnet again" in event.message
    assert victim.placements.get().outcome == "requeued"

    PolicySettings.objects.create(name="bp", policy="binpack", params={}, active=True)
    run_cycle()
    victim.refresh_from_db()
    assert victim.state == "PENDING"  # GPU 0 has room, but its resident is a resnet
    assert "OOM-killed beside their jobs' type before" in victim.waiting_reason
    assert "resnet on A30" in victim.waiting_reason


def test_an_oom_on_a_gpu_of_its_own_or_after_the_requeues_fails_the_job(alice, bob, settings):
    node = _Node()
    alone = node.run(alice, "alone", 1, "exclusive")
    alone = node.exit(alone, 1, TORCH_OOM)
    assert alone.state == "FAILED" and alone.oom_with == []
    node.run(bob, "neighbour", 0, "mps")
    tired = node.run(alice, "tired", 0, "mps")
    Job.objects.filter(pk=tired.pk).update(oom_requeues=3)
    tired = node.exit(tired, 1, TORCH_OOM)
    assert tired.state == "FAILED" and tired.exit_code == 1
    other = node.run(alice, "crash", 0, "mps")  # a crash that is no OOM fails as before
    assert node.exit(other, 2, "Segmentation fault\n").state == "FAILED"
