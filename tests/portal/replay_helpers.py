"""A small known history for the replay tests: nodes, profiles and finished jobs with their
times and attempts, written straight to the rows (as the live system leaves them)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from portal.core.models import ApplicationProfile, Gpu, Job, Node, Placement, ProfileGpuTime

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def make_nodes() -> dict[str, Node]:
    titan = Node.objects.create(name="gpu-titan", kind="gpu", cores=16, memory_mb=65536)
    for i in range(2):
        Gpu.objects.create(
            node=titan,
            index=i,
            model="TitanXp",
            memory_mb=12288,
            sm_count=30,
            sharing_modes=["exclusive", "time_slicing", "mps"],
        )
    cpu = Node.objects.create(name="cpu-a", kind="cpu", cores=8)
    Node.objects.filter(pk__in=[titan.pk, cpu.pk]).update(created_at=T0 - timedelta(days=1))
    return {"titan": titan, "cpu": cpu}


def make_profile(name: str = "ResNet", version: str = "1", **times: float) -> ApplicationProfile:
    profile = ApplicationProfile.objects.create(
        name=name, version=version, kind="dl-train", status="approved", gpu_memory_max_mb=3000
    )
    for model, seconds in (times or {"TitanXp": 600.0, "A30": 400.0}).items():
        ProfileGpuTime.objects.create(profile=profile, gpu_model=model, time_s=seconds)
    return profile


def finished_job(
    owner,
    *,
    name: str,
    submitted_s: float,
    wait_s: float,
    run_s: float,
    node: Node | None = None,
    gpus: int = 1,
    profile: ApplicationProfile | None = None,
    state: str = "COMPLETED",
    **fields,
) -> Job:
    """A job submitted ``submitted_s`` after T0 that waited ``wait_s`` and ran ``run_s``; its
    completed attempt holds the node's first ``gpus`` GPUs."""
    job = Job.objects.create(
        owner=owner, name=name, gpus=gpus, profile=profile, state=state, command="true", **fields
    )
    submitted = T0 + timedelta(seconds=submitted_s)
    started = submitted + timedelta(seconds=wait_s)
    Job.objects.filter(pk=job.pk).update(
        submitted_at=submitted,
        started_at=started,
        finished_at=started + timedelta(seconds=run_s),
    )
    if node is not None:
        placement = Placement.objects.create(
            job=job,
            node=node,
            policy="fifo",
            active=False,
            outcome="completed" if state == "COMPLETED" else "failed",
        )
        placement.gpus.set(list(node.gpus.order_by("index")[:gpus]))
    job.refresh_from_db()
    return job
