"""Writes to Cosched's data go through these functions (``<entity>_<action>``).

Views, serializers, forms and Celery tasks call them; they make the business decisions, apply the
state machine with conditional updates (a duplicate delivery changes nothing) and write the
``JobEvent`` timeline. A change and the messages it implies (a scheduling cycle, a nudge to the
node running the job) are written in one transaction (``portal.core.outbox``): the change
succeeds whether or not the broker is up, and takes effect on the node at its next sync.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from portal.core import jobcontrol, lookups, validation
from portal.core.importers import (
    ProfileImportConflict,
    ProfileImportError,
    ProfileRecord,
    RowError,
    memory_max_error,
    parse_profiles,
)
from portal.core.models import (
    ApplicationProfile,
    Job,
    JobEvent,
    Placement,
    ProfileGpuTime,
    ProfileMemoryStep,
)
from portal.core.outbox import emit_nudges, emit_schedule
from portal.core.states import TERMINAL, IllegalTransition, JobState, can_transition
from scheduler.domain import sharing_error

# How an attempt ends when its job enters a state (``Placement.outcome``).
_OUTCOME = {
    JobState.COMPLETED: Placement.Outcome.COMPLETED,
    JobState.FAILED: Placement.Outcome.FAILED,
    JobState.CANCELLED: Placement.Outcome.CANCELLED,
    JobState.PENDING: Placement.Outcome.REQUEUED,
}
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
    Entering a final state or PENDING ends the job's current attempt (its placement is
    released, with the outcome and ``message`` as the reason).
    """
    target_state = JobState(target)
    with transaction.atomic():
        current = expected or Job.objects.filter(pk=job.pk).values_list("state", flat=True).get()
        if not can_transition(current, target_state):
            raise IllegalTransition(job.pk, current, target_state)
        now = timezone.now()
        updates: dict[str, Any] = {"state": target_state.value, **fields}
        if target_state != JobState.PAUSED:
            updates.setdefault("user_paused", False)  # a person's pause ends with the pause
        stamp = _STAMP.get(target_state)
        # A resume continues the run: started_at stays the first start (Slow-Down, JCT and the
        # memory plan's speed estimate all count from it).
        if stamp and not (target_state == JobState.RUNNING and current == JobState.PAUSED):
            updates[stamp] = now
        if target_state == JobState.PENDING:
            updates["scheduled_at"] = None
            updates["started_at"] = None
        won = Job.objects.filter(pk=job.pk, state=current).update(**updates)
        if not won:
            fresh = Job.objects.filter(pk=job.pk).values_list("state", flat=True).get()
            raise IllegalTransition(job.pk, fresh, target_state)
        if target_state == JobState.PENDING:
            Job.objects.filter(pk=job.pk).update(requeue_count=F("requeue_count") + 1)
        if target_state in TERMINAL or target_state == JobState.PENDING:
            job.placements.filter(active=True).update(
                active=False,
                released_at=now,
                outcome=_OUTCOME[target_state],
                end_reason=message[:2000],
            )
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


def job_rule_errors(
    data: dict[str, Any], *, skip: set[str] | frozenset[str] = frozenset()
) -> dict[str, list[str]]:
    """The business rules of a submission, per field (empty dict: all good).

    ``data`` holds already type-checked values; fields in ``skip`` (those that already failed
    their type check) are left out of every rule that reads them, so callers can report type
    errors and rule errors together.
    """
    errors: dict[str, list[str]] = {}
    profile: ApplicationProfile | None = data.get("profile")
    if (
        "profile" not in skip
        and profile is not None
        and profile.status != ApplicationProfile.Status.APPROVED
    ):
        errors.setdefault("profile", []).append(
            f"profile {profile} is {profile.status}; only approved profiles can be used"
        )
    if (
        not skip & {"command", "container_image"}
        and not (data.get("command") or "").strip()
        and not (data.get("container_image") or "").strip()
    ):
        errors.setdefault("command", []).append("give a command (or a container image)")
    emin, emax = data.get("elastic_min_workers"), data.get("elastic_max_workers")
    if emin is not None and emax is not None and emin > emax:
        errors.setdefault("elastic_max_workers", []).append(
            f"must be at least elastic_min_workers ({emin})"
        )
    for name, messages in elastic_rule_errors(data, skip=skip).items():
        errors.setdefault(name, []).extend(messages)
    for name, messages in request_rule_errors(data, skip=skip).items():
        errors.setdefault(name, []).extend(messages)
    if "gpus" not in skip and data.get("gpus", 0) == 0 and data.get("gpu_memory_mb"):
        errors.setdefault("gpu_memory_mb", []).append("a CPU-only job (gpus=0) asks no GPU memory")
    # Bounds (portal.core.validation), then admission against the registered cluster.
    for name, messages in validation.job_input_errors(data).items():
        errors.setdefault(name, []).extend(messages)
    for name, messages in validation.admission_errors(data, skip=set(skip) | set(errors)).items():
        errors.setdefault(name, []).extend(messages)
    return errors


def default_sharing() -> str:
    """The site's default ``sharing`` (COSCHED_DEFAULT_SHARING; docs/jobs.md)."""
    return str(settings.COSCHED.get("DEFAULT_SHARING", "never"))


def request_defaults(data: dict[str, Any]) -> None:
    """Fill what a submission did not say about sharing and device (docs/jobs.md): the site's
    default sharing; device ``gpu`` for a GPU job, ``cpu`` for a CPU-only one."""
    if not data.get("sharing"):
        data["sharing"] = default_sharing()
    if not data.get("device"):
        data["device"] = "gpu" if (data.get("gpus") or 0) > 0 else "cpu"


def request_rule_errors(
    data: dict[str, Any], *, skip: set[str] | frozenset[str] = frozenset()
) -> dict[str, list[str]]:
    """Rules of the request semantics (docs/jobs.md): a known sharing value; ``device: cpu``
    only for a job of 0 GPUs, ``gpu`` / ``auto`` only for a job of at least one."""
    errors: dict[str, list[str]] = {}
    sharing = data.get("sharing")
    if "sharing" not in skip and sharing:
        problem = sharing_error(str(sharing))
        if problem:
            errors["sharing"] = [problem]
    device = data.get("device")
    if not skip & {"device", "gpus"} and device:
        gpus = data.get("gpus") or 0
        if device == "cpu" and gpus > 0:
            errors["device"] = [
                f"device cpu runs the job on a CPU node: ask 0 GPUs (it asks {gpus}), or "
                "device auto to let the policy choose"
            ]
        elif device in ("gpu", "auto") and gpus == 0:
            errors["device"] = [f"device {device} needs at least 1 GPU (gpus is 0)"]
    return errors


ELASTIC_EXTRAS = ("elastic_deadline_s", "elastic_value_per_hour", "max_global_batch")


def elastic_rule_errors(
    data: dict[str, Any], *, skip: set[str] | frozenset[str] = frozenset()
) -> dict[str, list[str]]:
    """Rules of an elastic declaration (issue 17): a utility and a maximum global batch only for
    a job with a worker range; a deadline or a value per hour, not both; a global batch of at
    least one sample per worker."""
    errors: dict[str, list[str]] = {}
    emin, emax = data.get("elastic_min_workers"), data.get("elastic_max_workers")
    elastic = emin is not None or emax is not None
    for name in ELASTIC_EXTRAS:
        if name not in skip and data.get(name) is not None and not elastic:
            errors.setdefault(name, []).append(
                "only for an elastic job: give elastic_min_workers and/or elastic_max_workers"
            )
    if (
        not skip & {"elastic_deadline_s", "elastic_value_per_hour"}
        and data.get("elastic_deadline_s") is not None
        and data.get("elastic_value_per_hour") is not None
    ):
        errors.setdefault("elastic_value_per_hour", []).append(
            "give a deadline (elastic_deadline_s) or a value per hour, not both"
        )
    batch = data.get("max_global_batch")
    if (
        "max_global_batch" not in skip
        and isinstance(batch, int)
        and isinstance(emin, int)
        and batch < emin
    ):
        errors.setdefault("max_global_batch", []).append(
            f"must be at least elastic_min_workers ({emin}): one sample per worker"
        )
    return errors


def submission_project(owner: Any, name: Any) -> Any:
    """``portal.teams.services.project_for_submission``, read once per
    ``portal.core.lookups.submission_lookups`` block for a given owner and project name."""
    from portal.teams.services import project_for_submission

    if name is not None and not isinstance(name, str):  # a Project: nothing to look up by name
        return project_for_submission(owner, name)
    return lookups.remembered(
        ("project", owner.pk, name or ""), lambda: project_for_submission(owner, name)
    )


def job_submit(owner: Any, *, idempotency_key: str | None = None, **data: Any) -> tuple[Job, bool]:
    """Create a PENDING job for ``owner`` from already type-checked fields.

    Business rules are checked here and reported per field (``ValidationError`` with a dict);
    nothing is stored when one fails. With ``idempotency_key``, a retry returns the job the first
    request created (``created`` False) instead of a second one; a different body under the same
    key raises ``IdempotencyConflict``. Returns ``(job, created)``.
    """
    project_name = data.pop("project", None)
    array: jobcontrol.ArraySpec | None = data.pop("array", None)
    data["dependencies"] = list(data.get("dependencies") or [])
    errors = job_rule_errors(data)
    problems = jobcontrol.dependency_errors(owner, data["dependencies"])
    if problems:
        errors.setdefault("dependencies", []).extend(problems)
    try:
        project = submission_project(owner, project_name)
    except ValidationError as exc:
        errors.setdefault("project", []).extend(exc.message_dict["project"])
    if errors:
        raise ValidationError(errors)
    request_defaults(data)
    profile: ApplicationProfile | None = data.get("profile")
    if profile is not None and not data.get("kind"):
        data["kind"] = profile.kind
    default_limit = None if profile is None else profile.default_time_limit_s

    fingerprint = ""
    if idempotency_key:
        fingerprint = _fingerprint(
            {k: (v.pk if isinstance(v, ApplicationProfile) else v) for k, v in data.items()}
            | ({"project": project.name} if project_name else {})
            | ({"array": [list(array.indices), array.limit]} if array else {})
        )
        existing = Job.objects.filter(owner=owner, idempotency_key=idempotency_key).first()
        if existing is not None:
            if existing.idempotency_fingerprint != fingerprint:
                raise IdempotencyConflict(existing)
            return existing, False
    if data.get("time_limit_s") is None and default_limit:
        data["time_limit_s"] = default_limit  # the profile's default (after the fingerprint)
    try:
        with transaction.atomic():
            note = validation.admission_note(data)
            if array is not None:
                data.update(array_index=array.indices[0], array_limit=array.limit)
            job = Job.objects.create(
                owner=owner,
                project=project,
                idempotency_key=idempotency_key or None,
                idempotency_fingerprint=fingerprint,
                waiting_reason=note,
                **data,
            )
            actor = f"user:{owner.get_username()}"
            JobEvent.objects.create(
                job=job, from_state="", to_state=JobState.PENDING, actor=actor, message="submitted"
            )
            if array is not None:
                _array_tasks_create(job, array, actor=actor, note=note, data=data)
            emit_schedule(f"job {job.pk} submitted")
    except IntegrityError:
        # A concurrent retry with the same key won the race: return its job.
        if not idempotency_key:
            raise
        existing = Job.objects.get(owner=owner, idempotency_key=idempotency_key)
        if existing.idempotency_fingerprint != fingerprint:
            raise IdempotencyConflict(existing) from None
        return existing, False
    return job, True


#: The most jobs one bulk submission may hold (an array holds more, in one row's worth of input).
BULK_MAX_JOBS = 1000


class BulkSubmitError(Exception):
    """A bulk submission refused whole: ``errors`` maps an item's index to its field errors."""

    def __init__(self, errors: dict[int, dict[str, list[str]]]) -> None:
        super().__init__(f"{len(errors)} of the jobs are refused")
        self.errors = errors


def jobs_submit_bulk(
    owner: Any, items: list[dict[str, Any]], *, idempotency_key: str | None = None
) -> tuple[list[Job], bool]:
    """Submit ``items`` (each already type-checked, as for ``job_submit``) all or nothing.

    Every item is checked, so the error names every bad one (``BulkSubmitError``, nothing
    stored); otherwise all jobs are created in one transaction. With ``idempotency_key``, item
    ``i`` gets the key ``KEY#i``: a retry of the same batch returns the jobs the first one
    created (``created`` False); the same key with a different batch raises
    ``IdempotencyConflict``. Returns ``(jobs, created)``.
    """
    if not items:
        raise BulkSubmitError({0: {"jobs": ["give at least one job"]}})
    if len(items) > BULK_MAX_JOBS:
        raise BulkSubmitError({0: {"jobs": [f"at most {BULK_MAX_JOBS} jobs in one submission"]}})
    jobs: list[Job] = []
    created_any = False
    errors: dict[int, dict[str, list[str]]] = {}
    with transaction.atomic():
        for i, data in enumerate(items):
            key = f"{idempotency_key}#{i}" if idempotency_key else None
            try:
                job, created = job_submit(owner, idempotency_key=key, **dict(data))
            except ValidationError as exc:
                errors[i] = (
                    exc.message_dict
                    if hasattr(exc, "error_dict")
                    else {"non_field_errors": list(exc.messages)}
                )
                continue
            created_any = created_any or created
            jobs.append(job)
        if errors:
            raise BulkSubmitError(errors)  # leaving the block this way rolls every job back
    return jobs, created_any


def _array_tasks_create(
    first: Job, array: jobcontrol.ArraySpec, *, actor: str, note: str, data: dict[str, Any]
) -> None:
    """The array's other tasks, in a few bulk INSERTs (one submission of 1,000 tasks takes
    well under a second): copies of ``first`` with their own index; ``first`` is the array."""
    Job.objects.filter(pk=first.pk).update(array_of=first)
    first.array_of_id = first.pk
    fields = {k: v for k, v in data.items() if k != "array_index"}
    tasks = [
        Job(
            owner_id=first.owner_id,
            project_id=first.project_id,
            waiting_reason=note,
            array_of_id=first.pk,
            array_index=index,
            **fields,
        )
        for index in array.indices[1:]
    ]
    created = Job.objects.bulk_create(tasks, batch_size=500)
    JobEvent.objects.bulk_create(
        (
            JobEvent(
                job_id=t.pk,
                from_state="",
                to_state=JobState.PENDING,
                actor=actor,
                message=f"submitted: task {t.array_index} of array {first.pk}",
            )
            for t in created
        ),
        batch_size=500,
    )


def job_hold(job: Job, *, actor: str) -> Job:
    """Hold a PENDING job: the scheduler does not start it until ``job_release``. Any other
    state raises ``IllegalTransition``."""
    with transaction.atomic():
        if not Job.objects.filter(pk=job.pk, state=JobState.PENDING).update(held=True):
            current = Job.objects.filter(pk=job.pk).values_list("state", flat=True).get()
            raise IllegalTransition(job.pk, current, "held")
        job.refresh_from_db()
        job_note(job, actor=actor, message=f"held by {actor}")
    return job


def job_release(job: Job, *, actor: str) -> Job:
    """Release a held job (it queues as before); a job that is not held raises
    ``IllegalTransition``."""
    with transaction.atomic():
        if not Job.objects.filter(pk=job.pk, held=True).update(held=False, waiting_reason=""):
            current = Job.objects.filter(pk=job.pk).values_list("state", flat=True).get()
            raise IllegalTransition(job.pk, current, "released (it is not held)")
        job.refresh_from_db()
        job_note(job, actor=actor, message=f"released by {actor}")
        emit_schedule(f"job {job.pk} released")
    return job


#: What the owner may change while a job is PENDING (``job_update``).
EDITABLE_FIELDS = (
    "gpus",
    "gpu_memory_mb",
    "cpus",
    "memory_mb",
    "time_limit_s",
    "priority",
    "dependencies",
)


def job_update(job: Job, *, actor: str, owner: Any, **changes: Any) -> Job:
    """Change a PENDING job's resources, time limit, priority or dependencies. The result is
    checked as a submission would be (``ValidationError`` per field); a job no longer PENDING
    raises ``IllegalTransition``."""
    unknown = sorted(set(changes) - set(EDITABLE_FIELDS))
    if unknown:
        raise ValidationError({name: ["cannot be changed after submission"] for name in unknown})
    with transaction.atomic():
        locked = (
            Job.objects.select_for_update(of=("self",)).select_related("profile").get(pk=job.pk)
        )
        if locked.state != JobState.PENDING:
            raise IllegalTransition(job.pk, locked.state, "edited")
        merged = {
            "name": locked.name,
            "command": locked.command,
            "container_image": locked.container_image,
            "profile": locked.profile,
            "kind": locked.kind,
            "params": locked.params,
            "elastic_min_workers": locked.elastic_min_workers,
            "elastic_max_workers": locked.elastic_max_workers,
            **{name: getattr(locked, name) for name in EDITABLE_FIELDS},
            **changes,
        }
        errors = job_rule_errors(merged)
        if "dependencies" in changes:
            problems = jobcontrol.dependency_errors(
                owner, changes["dependencies"] or [], job_id=job.pk
            )
            cycle = (
                None
                if problems
                else jobcontrol.dependency_cycle(job.pk, changes["dependencies"] or [])
            )
            if cycle:
                problems = [
                    "a cycle: job "
                    + " waits for job ".join(map(str, cycle))
                    + f" waits for job {job.pk}"
                ]
            if problems:
                errors.setdefault("dependencies", []).extend(problems)
        errors = {k: v for k, v in errors.items() if k in changes} or errors
        if errors:
            raise ValidationError(errors)
        before = {name: getattr(locked, name) for name in changes}
        Job.objects.filter(pk=job.pk).update(waiting_reason="", **changes)
        said = ", ".join(
            f"{name} {before[name]!r} -> {value!r}"
            for name, value in changes.items()
            if before[name] != value
        )
        job.refresh_from_db()
        job_note(job, actor=actor, message=f"edited by {actor}: {said or 'no change'}")
        emit_schedule(f"job {job.pk} edited")
    return job


def job_requeue(job: Job, *, actor: str) -> Job:
    """The owner puts a placed job (SCHEDULED, RUNNING or PAUSED) back in the queue: it is
    stopped like a preemption (SIGTERM, then SIGKILL after the grace) and placed again later;
    the attempt ends ``requeued``. Any other state raises ``IllegalTransition``."""
    with transaction.atomic():
        current = (
            Job.objects.select_for_update().filter(pk=job.pk).values_list("state", flat=True).get()
        )
        if current not in (JobState.SCHEDULED, JobState.RUNNING, JobState.PAUSED):
            raise IllegalTransition(job.pk, current, JobState.PENDING)
        nodes = job_nodes(job.pk)
        job = job_transition(
            job,
            JobState.PENDING,
            actor=actor,
            message=f"requeued by {actor}",
            expected=current,
            user_paused=False,
        )
        emit_nudges(nodes, f"job {job.pk} requeued")
        emit_schedule(f"job {job.pk} requeued")
    return job


def job_nodes(job_id: int) -> set[str]:
    """Names of the nodes holding the job's current attempt (every node of a gang)."""
    from portal.core.models import PlacementPart

    return set(
        PlacementPart.objects.filter(placement__job_id=job_id, placement__active=True).values_list(
            "node__name", flat=True
        )
    )


def job_cancel(job: Job, *, actor: str, message: str = "cancelled") -> Job:
    """Cancel a job that is not finished yet. A finished job raises ``IllegalTransition``.
    Its node's agent stops the processes at its next sync (nudged to sync now)."""
    with transaction.atomic():
        nodes = job_nodes(job.pk)
        job = job_transition(job, JobState.CANCELLED, actor=actor, message=message)
        emit_nudges(nodes, f"job {job.pk} cancelled")
        emit_schedule(f"job {job.pk} cancelled")
    return job


def job_preempt(job: Job, *, actor: str, reason: str) -> Job:
    """Preempt a placed job (SCHEDULED, RUNNING or PAUSED): it goes back to PENDING and is
    placed again by a later cycle; its current attempt ends with outcome ``preempted`` and
    ``reason`` (a policy's explanation, or who asked). Its nodes' agents stop the processes at
    their next sync (nudged now): SIGTERM, then SIGKILL after ``COSCHED_STOP_GRACE_S``, so the
    job can checkpoint to ``COSCHED_CHECKPOINT_DIR``. The next attempt is launched only once
    this one is known to have stopped (``portal.core.agent_sync``). Any other state raises
    ``IllegalTransition``. Used by policies' REQUEUE actions and by staff."""
    reason = reason.strip() or "preempted"
    with transaction.atomic():
        current = (
            Job.objects.select_for_update().filter(pk=job.pk).values_list("state", flat=True).get()
        )
        if current not in (JobState.SCHEDULED, JobState.RUNNING, JobState.PAUSED):
            raise IllegalTransition(job.pk, current, JobState.PENDING)
        nodes = job_nodes(job.pk)
        attempt = job.placements.filter(active=True).values_list("pk", flat=True).first()
        job = job_transition(
            job, JobState.PENDING, actor=actor, message=f"preempted: {reason}", expected=current
        )
        if attempt is not None:
            Placement.objects.filter(pk=attempt).update(
                outcome=Placement.Outcome.PREEMPTED, end_reason=reason[:2000]
            )
        emit_nudges(nodes, f"job {job.pk} preempted")
        emit_schedule(f"job {job.pk} preempted")
    return job


def job_pause(job: Job, *, actor: str, message: str = "paused", by_user: bool = False) -> Job:
    """Pause a RUNNING job (SIGSTOP on its node at the agent's next sync; it keeps its GPU
    memory and placement). Any other state raises ``IllegalTransition``. ``by_user``: a person
    paused it: it stays paused until resumed by a person (the cycle leaves it alone)."""
    with transaction.atomic():
        job = job_transition(
            job,
            JobState.PAUSED,
            actor=actor,
            message=message,
            expected="RUNNING",
            user_paused=by_user,
        )
        emit_nudges(job_nodes(job.pk), f"job {job.pk} paused")
    return job


def job_resume(job: Job, *, actor: str, message: str = "resumed") -> Job:
    """Resume a PAUSED job (SIGCONT on its node). Any other state raises ``IllegalTransition``."""
    with transaction.atomic():
        job = job_transition(
            job,
            JobState.RUNNING,
            actor=actor,
            message=message,
            expected="PAUSED",
            user_paused=False,
        )
        emit_nudges(job_nodes(job.pk), f"job {job.pk} resumed")
    return job


# ---------------------------------------------------------------------------------------------
# Profiles: create / update, import, approve, retire


def _profile_write(
    record: ProfileRecord, *, profile: ApplicationProfile | None, **extra: Any
) -> ApplicationProfile:
    """Create (``profile`` None) or update a profile from a validated record: only the fields
    the record gives are written; child tables are replaced when the record gives them.
    Raises ValidationError on ``gpu_memory_max_mb`` when the resulting maximum is below the
    peak of the resulting memory steps (``importers.memory_max_error``)."""
    max_mb = record.fields.get(
        "gpu_memory_max_mb", profile.gpu_memory_max_mb if profile is not None else None
    )
    steps = record.memory_steps
    if steps is None and profile is not None:
        steps = [(s.start_fraction, s.from_mb, s.to_mb) for s in profile.memory_steps.all()]
    problem = memory_max_error(max_mb, steps)
    if problem:
        raise ValidationError({"gpu_memory_max_mb": [problem]})
    if profile is None:
        profile = ApplicationProfile(**record.fields, **extra)
    else:
        for name, value in {**record.fields, **extra}.items():
            setattr(profile, name, value)
    profile.save()
    if record.gpu_times is not None:
        profile.gpu_times.all().delete()
        ProfileGpuTime.objects.bulk_create(
            ProfileGpuTime(profile=profile, gpu_model=model, time_s=seconds)
            for model, seconds in sorted(record.gpu_times.items())
        )
    if record.memory_steps is not None:
        profile.memory_steps.all().delete()
        ProfileMemoryStep.objects.bulk_create(
            ProfileMemoryStep(profile=profile, index=i, start_fraction=start, from_mb=lo, to_mb=hi)
            for i, (start, lo, hi) in enumerate(record.memory_steps, 1)
        )
    return profile


def profile_save(
    record: ProfileRecord,
    *,
    actor: Any = None,
    profile: ApplicationProfile | None = None,
    source: str = ApplicationProfile.Source.MANUAL,
) -> ApplicationProfile:
    """Create a draft profile from ``record`` (or update ``profile``) in one transaction.

    A new name+version that already exists raises ``ValidationError`` on ``name``."""
    with transaction.atomic():
        clash = ApplicationProfile.objects.filter(
            name=record.fields.get("name", profile.name if profile else ""),
            version=record.fields.get("version", profile.version if profile else "1"),
        )
        if profile is not None:
            clash = clash.exclude(pk=profile.pk)
        if clash.exists():
            raise ValidationError({"name": ["a profile with this name and version already exists"]})
        if profile is None:
            return _profile_write(record, profile=None, source=source, created_by=actor)
        return _profile_write(record, profile=profile)


@dataclass
class ImportResult:
    created: list[ApplicationProfile]
    updated: list[ApplicationProfile]

    @property
    def profiles(self) -> list[ApplicationProfile]:
        return self.created + self.updated


def profile_import(
    content: bytes | str,
    *,
    actor: Any = None,
    fmt: str | None = None,
    filename: str | None = None,
    status: str = ApplicationProfile.Status.DRAFT,
    source: str = ApplicationProfile.Source.IMPORTED,
    update_existing: bool = False,
    options: dict[str, Any] | None = None,
) -> ImportResult:
    """Import profiles from a file (formats: ``portal.core.importers``), all or nothing.

    Every row is validated first; any error raises ``ProfileImportError`` listing every bad
    row and field, and nothing is stored. A name+version that exists already is an error unless
    ``update_existing`` (then the fields the file gives overwrite, the rest are kept). Imported
    profiles get ``status`` (default draft) and ``source`` (default imported).
    """
    if status not in ApplicationProfile.Status.values:
        raise ProfileImportError([RowError(None, "status", f"unknown status {status!r}")])
    if source not in ApplicationProfile.Source.values:
        raise ProfileImportError([RowError(None, "source", f"unknown source {source!r}")])
    records = parse_profiles(content, fmt=fmt, filename=filename, options=options)
    now = timezone.now()
    approval: dict[str, Any] = {"status": status, "source": source}
    if status == ApplicationProfile.Status.APPROVED:
        approval.update(approved_by=actor, approved_at=now)
    try:
        return _profile_import_rows(records, actor, approval, update_existing)
    except IntegrityError:  # only without advisory locks (SQLite): another import won the race
        names = ", ".join(sorted({f"{r.key[0]} v{r.key[1]}" for r in records}))
        raise ProfileImportConflict(
            [
                RowError(
                    None,
                    "name",
                    f"another import stored profile {names} at the same time; nothing imported: "
                    "look at the profiles and import again (with update_existing to overwrite)",
                )
            ]
        ) from None


def _lock_profile_names(names: Iterable[str]) -> None:
    """Serialise imports of the same profile names (PostgreSQL transaction advisory locks, in
    sorted order so two imports never deadlock): the second import of a new profile then finds
    it stored and answers that it exists, instead of failing on the unique constraint."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for name in sorted(set(names)):
            cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [_PROFILE_LOCK, name])


_PROFILE_LOCK = 0x70726F66  # "prof": the advisory lock class of profile imports


def _profile_import_rows(
    records: list[Any], actor: Any, approval: dict[str, Any], update_existing: bool
) -> ImportResult:
    result = ImportResult(created=[], updated=[])
    with transaction.atomic():
        _lock_profile_names(r.key[0] for r in records)
        existing = {
            (p.name, p.version): p
            for p in ApplicationProfile.objects.select_for_update().filter(
                name__in=[r.key[0] for r in records]
            )
        }
        errors = [
            RowError(
                r.row,
                "name",
                f"profile {r.key[0]} v{r.key[1]} already exists (id {existing[r.key].pk}); "
                "import with update_existing to overwrite it",
            )
            for r in records
            if r.key in existing and not update_existing
        ]
        if errors:
            raise ProfileImportError(errors)
        for record in records:
            current = existing.get(record.key)
            try:
                if current is None:
                    result.created.append(
                        _profile_write(record, profile=None, created_by=actor, **approval)
                    )
                else:
                    result.updated.append(_profile_write(record, profile=current, **approval))
            except ValidationError as exc:  # checked against the stored profile: a row error
                errors.extend(
                    RowError(record.row, field, message)
                    for field, messages in exc.message_dict.items()
                    for message in messages
                )
        if errors:  # all or nothing: the rows written above are rolled back
            raise ProfileImportError(errors)
    return result


def profile_approve(profile: ApplicationProfile, *, actor: Any) -> ApplicationProfile:
    """Approve a profile (jobs may then reference it); records who and when."""
    ApplicationProfile.objects.filter(pk=profile.pk).update(
        status=ApplicationProfile.Status.APPROVED,
        approved_by=actor,
        approved_at=timezone.now(),
        updated_at=timezone.now(),
    )
    profile.refresh_from_db()
    return profile


def profile_retire(profile: ApplicationProfile, *, actor: Any) -> ApplicationProfile:
    """Retire a profile: existing jobs keep it, new jobs may no longer use it."""
    ApplicationProfile.objects.filter(pk=profile.pk).update(
        status=ApplicationProfile.Status.RETIRED, updated_at=timezone.now()
    )
    profile.refresh_from_db()
    return profile
