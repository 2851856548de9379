"""Writes to Cosched's data go through these functions (``<entity>_<action>``).

Views, serializers, forms and Celery tasks call them; they make the business decisions, apply the
state machine with conditional updates (a duplicate delivery changes nothing) and write the
``JobEvent`` timeline.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.core.models import ApplicationProfile, Job, JobEvent
from portal.core.states import TERMINAL, IllegalTransition, JobState, can_transition

# Timestamp column set when a job enters a state.
_STAMP = {
    JobState.SCHEDULED: "scheduled_at",
    JobState.RUNNING: "started_at",
    JobState.COMPLETED: "finished_at",
    JobState.FAILED: "finished_at",
    JobState.CANCELLED: "finished_at",
}


def job_transition(
    job: Job,
    target: str,
    *,
    actor: str,
    message: str = "",
    expected: str | None = None,
    **fields: Any,
) -> Job:
    """Move ``job`` to ``target`` and record a ``JobEvent``.

    The update is conditional on the state the row is in (``expected``, else the state read now),
    so two workers racing on one job cannot both win: the loser gets ``IllegalTransition``.
    Extra ``fields`` (``exit_code``, ``failure_reason``, ...) are written in the same UPDATE.
    """
    target_state = JobState(target)
    with transaction.atomic():
        current = expected or Job.objects.filter(pk=job.pk).values_list("state", flat=True).get()
        if not can_transition(current, target_state):
            raise IllegalTransition(job.pk, current, target_state)
        now = timezone.now()
        updates: dict[str, Any] = {"state": target_state.value, **fields}
        stamp = _STAMP.get(target_state)
        if stamp:
            updates[stamp] = now
        if target_state == JobState.PENDING:
            updates["scheduled_at"] = None
            updates["started_at"] = None
        won = Job.objects.filter(pk=job.pk, state=current).update(**updates)
        if not won:
            fresh = Job.objects.filter(pk=job.pk).values_list("state", flat=True).get()
            raise IllegalTransition(job.pk, fresh, target_state)
        if target_state == JobState.PENDING:
            Job.objects.filter(pk=job.pk).update(requeue_count=job.requeue_count + 1)
        if target_state in TERMINAL or target_state == JobState.PENDING:
            job.placements.filter(active=True).update(active=False, released_at=now)
        JobEvent.objects.create(
            job=job, from_state=current, to_state=target_state.value, actor=actor, message=message
        )
    job.refresh_from_db()
    return job


def job_note(job: Job, *, actor: str, message: str) -> JobEvent:
    """Add a timeline entry that is not a transition (a pause reason, a decision)."""
    return JobEvent.objects.create(
        job=job, from_state=job.state, to_state=job.state, actor=actor, message=message
    )


def _fingerprint(data: dict[str, Any]) -> str:
    canonical = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


class IdempotencyConflict(Exception):
    """An Idempotency-Key was reused with a different request body."""

    def __init__(self, job: Job) -> None:
        super().__init__(
            f"Idempotency-Key already used for job {job.pk} with a different request body"
        )
        self.job = job


def job_submit(owner: Any, *, idempotency_key: str | None = None, **data: Any) -> tuple[Job, bool]:
    """Create a PENDING job for ``owner`` from already type-checked fields.

    Business rules are checked here and reported per field (``ValidationError`` with a dict);
    nothing is stored when one fails. With ``idempotency_key``, a retry returns the job the first
    request created (``created`` False) instead of a second one; a different body under the same
    key raises ``IdempotencyConflict``. Returns ``(job, created)``.
    """
    errors: dict[str, list[str]] = {}
    profile: ApplicationProfile | None = data.get("profile")
    if profile is not None and profile.status != ApplicationProfile.Status.APPROVED:
        errors.setdefault("profile", []).append(
            f"profile {profile} is {profile.status}; only approved profiles can be used"
        )
    if not (data.get("command") or "").strip() and not (data.get("container_image") or "").strip():
        errors.setdefault("command", []).append("give a command (or a container image)")
    emin, emax = data.get("elastic_min_workers"), data.get("elastic_max_workers")
    if emin is not None and emax is not None and emin > emax:
        errors.setdefault("elastic_max_workers", []).append(
            f"must be at least elastic_min_workers ({emin})"
        )
    if data.get("gpus", 0) == 0 and data.get("gpu_memory_mb"):
        errors.setdefault("gpu_memory_mb", []).append("a CPU-only job (gpus=0) asks no GPU memory")
    if errors:
        raise ValidationError(errors)
    if profile is not None and not data.get("kind"):
        data["kind"] = profile.kind

    fingerprint = ""
    if idempotency_key:
        fingerprint = _fingerprint(
            {k: (v.pk if isinstance(v, ApplicationProfile) else v) for k, v in data.items()}
        )
        existing = Job.objects.filter(owner=owner, idempotency_key=idempotency_key).first()
        if existing is not None:
            if existing.idempotency_fingerprint != fingerprint:
                raise IdempotencyConflict(existing)
            return existing, False
    try:
        with transaction.atomic():
            job = Job.objects.create(
                owner=owner,
                idempotency_key=idempotency_key or None,
                idempotency_fingerprint=fingerprint,
                **data,
            )
            JobEvent.objects.create(
                job=job,
                from_state="",
                to_state=JobState.PENDING,
                actor=f"user:{owner.get_username()}",
                message="submitted",
            )
    except IntegrityError:
        # A concurrent retry with the same key won the race: return its job.
        if not idempotency_key:
            raise
        existing = Job.objects.get(owner=owner, idempotency_key=idempotency_key)
        if existing.idempotency_fingerprint != fingerprint:
            raise IdempotencyConflict(existing) from None
        return existing, False
    _after_submit(job)
    return job, True


def _after_submit(job: Job) -> None:
    """Hook for the scheduling loop (a later issue): enqueue a cycle once the row is committed."""
    try:
        from workers import triggers
    except ImportError:
        return
    transaction.on_commit(lambda: triggers.on_job_submitted(job.pk))


def job_cancel(job: Job, *, actor: str, message: str = "cancelled") -> Job:
    """Cancel a job that is not finished yet. A finished job raises ``IllegalTransition``."""
    job = job_transition(job, JobState.CANCELLED, actor=actor, message=message)
    try:
        from workers import triggers
    except ImportError:
        return job
    transaction.on_commit(lambda: triggers.on_job_cancelled(job.pk))
    return job
