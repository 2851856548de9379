"""The job state machine, in one place (pure Python; the service layer applies it to rows).

PENDING -> SCHEDULED -> RUNNING <-> PAUSED -> COMPLETED | FAILED | CANCELLED
SCHEDULED / RUNNING / PAUSED -> PENDING   (requeue: node lost, OOM requeue, preemption)
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


TERMINAL: frozenset[JobState] = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
# States in which a job holds a placement (GPU memory, cores) on a node.
PLACED: frozenset[JobState] = frozenset({JobState.SCHEDULED, JobState.RUNNING, JobState.PAUSED})

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.SCHEDULED, JobState.CANCELLED, JobState.FAILED}),
    JobState.SCHEDULED: frozenset(
        {JobState.RUNNING, JobState.PENDING, JobState.CANCELLED, JobState.FAILED}
    ),
    JobState.RUNNING: frozenset(
        {
            JobState.PAUSED,
            JobState.COMPLETED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.PENDING,
        }
    ),
    JobState.PAUSED: frozenset(
        {JobState.RUNNING, JobState.FAILED, JobState.CANCELLED, JobState.PENDING}
    ),
    JobState.COMPLETED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class IllegalTransition(Exception):
    """A job was asked to move between two states the machine does not connect."""

    def __init__(self, job_id: object, current: str, target: str) -> None:
        allowed = ", ".join(sorted(TRANSITIONS.get(JobState(current), ()))) or "none (final state)"
        super().__init__(
            f"job {job_id}: cannot go from {current} to {target}; allowed from {current}: {allowed}"
        )
        self.job_id = job_id
        self.current = current
        self.target = target


def can_transition(current: str, target: str) -> bool:
    return JobState(target) in TRANSITIONS[JobState(current)]


def sources_of(target: str) -> list[str]:
    """Every state from which ``target`` can be reached (for conditional UPDATEs)."""
    t = JobState(target)
    return [s.value for s, targets in TRANSITIONS.items() if t in targets]
