"""Small snapshots for the peer policies' unit tests (``tests/scheduler/test_peers_*.py``)."""

from __future__ import annotations

from dataclasses import replace

from scheduler.domain import (
    ClusterState,
    JobSpec,
    NodeState,
    Placement,
    Profile,
    RunningJob,
    SharingMode,
)
from tests.scheduler.snapshots import GB, gpu_node


def pjob(job_id: str, times: dict[str, float], *, arrival: float = 0.0, gpus: int = 1,
         owner: str | None = None) -> JobSpec:  # fmt: skip
    """A job with profiled solo times per model."""
    return JobSpec(
        id=job_id,
        arrival_s=arrival,
        gpus=gpus,
        gpu_memory_mb=2 * GB,
        owner=owner,
        profile=Profile(f"type-{job_id}", gpu_time_s=times),
    )


def running_on(node: NodeState, index: int, job: JobSpec, started: float, progress: float = 0.0
               ) -> tuple[NodeState, RunningJob]:  # fmt: skip
    """``node`` with ``job`` exclusive on GPU ``index``, and its RunningJob."""
    gpus = tuple(
        replace(
            g,
            mode=SharingMode.EXCLUSIVE,
            job_ids=(job.id,),
            committed_memory_mb=job.memory_need_mb(),
        )  # fmt: skip
        if g.index == index
        else g
        for g in node.gpus
    )
    rj = RunningJob(job, Placement(job.id, node.name, (index,), SharingMode.EXCLUSIVE), started,
                    progress)  # fmt: skip
    return replace(node, gpus=gpus), rj


def state(now: float, nodes: list[NodeState], pending: list[JobSpec],
          running: list[RunningJob] = ()) -> ClusterState:  # type: ignore[assignment]  # fmt: skip
    return ClusterState(now_s=now, nodes=tuple(nodes), pending=tuple(pending),
                        running=tuple(running))  # fmt: skip


__all__ = ["GB", "gpu_node", "pjob", "running_on", "state"]
