"""Read queries shared by the REST API, the browser pages and the CLI-facing endpoints.

Permission rules live here so every entry point applies the same ones: a user sees their own jobs
and the jobs of the projects they are a member of (anyone else's job is "not found", never
"forbidden"), staff see all; non-staff see only approved profiles.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Prefetch, Q, QuerySet, Subquery
from django.http import Http404

from portal.core.models import (
    JOB_KINDS,
    ApplicationProfile,
    Gpu,
    Job,
    JobEvent,
    Node,
    Placement,
)
from portal.core.states import JobState
from portal.teams.models import Membership
from portal.teams.selectors import can_see_job, project_ids_of

_KIND_VALUES = {value for value, _label in JOB_KINDS}


def _parse_states(raw: str | list[str] | None) -> list[str]:
    """``"pending,running"`` or ``["PENDING"]`` -> ``["PENDING", "RUNNING"]``; bad names raise."""
    if not raw:
        return []
    parts = raw.split(",") if isinstance(raw, str) else [p for item in raw for p in item.split(",")]
    states: list[str] = []
    bad: list[str] = []
    for part in (p.strip() for p in parts):
        if not part:
            continue
        try:
            states.append(JobState(part.upper()).value)
        except ValueError:
            bad.append(part)
    if bad:
        known = ", ".join(s.value for s in JobState)
        raise ValidationError({"state": [f"unknown state {', '.join(bad)}; known: {known}"]})
    return states


def jobs_visible_to(
    user: Any,
    *,
    state: str | list[str] | None = None,
    kind: str | None = None,
    search: str | None = None,
    finished_since: Any = None,
    finished_until: Any = None,
    owner: str | None = None,
    project: str | None = None,
) -> QuerySet[Job]:
    """The jobs ``user`` may see, newest first, optionally filtered.

    ``state`` is one state or a comma-separated list (case-insensitive); ``kind`` one job kind;
    ``search`` a substring of the job name. Unknown states or kinds raise ``ValidationError``
    keyed by the parameter name. History (like ``sacct``): ``finished_since`` /
    ``finished_until`` (datetimes) keep the jobs that finished in that window, latest finish
    first; ``owner`` a username, ``project`` a project name (among the jobs ``user`` sees).
    """
    qs = Job.objects.select_related("owner", "profile", "project").prefetch_related(
        Prefetch(
            "placements",
            queryset=Placement.objects.select_related("node")
            .prefetch_related("gpus", "parts__node")
            .order_by("-active", "-id"),
            to_attr="placements_newest_first",
        )
    )
    if not user.is_staff:
        member_of = Membership.objects.filter(user=user).values("project_id")
        qs = qs.filter(Q(owner=user) | Q(project_id__in=Subquery(member_of)))
    states = _parse_states(state)
    if states:
        qs = qs.filter(state__in=states)
    if kind:
        if kind not in _KIND_VALUES:
            known = ", ".join(sorted(_KIND_VALUES))
            raise ValidationError({"kind": [f"unknown kind {kind!r}; known: {known}"]})
        qs = qs.filter(kind=kind)
    if search:
        qs = qs.filter(name__icontains=search.strip())
    if owner:
        qs = qs.filter(owner__username=owner.strip())
    if project:
        qs = qs.filter(project__name=project.strip())
    if finished_since is not None or finished_until is not None:
        qs = qs.filter(finished_at__isnull=False)
        if finished_since is not None:
            qs = qs.filter(finished_at__gte=finished_since)
        if finished_until is not None:
            qs = qs.filter(finished_at__lt=finished_until)
        return qs.order_by("-finished_at", "-id")
    return qs.order_by("-submitted_at", "-id")


def job_history(job: Job, now: Any = None) -> dict[str, Any]:
    """What ``sacct`` would say of ``job``: ``elapsed_s`` (its last start to its end, or now),
    ``queue_wait_s`` (submission to its first start, or to now while it never started),
    ``gpu_hours`` (GPUs x time of every attempt), ``nodes`` (its last attempt's nodes, rank
    order). Reads the prefetch of ``jobs_visible_to``; cached on the object."""
    cached = getattr(job, "_history", None)
    if cached is not None:
        return cached
    from django.utils import timezone

    now = now or timezone.now()
    attempts = job_attempts(job)
    started = [a.started_at for a in attempts if a.started_at is not None]
    end = job.finished_at or now
    first = min(started) if started else None
    last = max(started) if started else None
    gpu_s = 0.0
    for a in attempts:
        if a.started_at is None:
            continue
        stop = a.released_at or (job.finished_at if job.finished_at else now)
        gpu_s += len(a.gpus.all()) * max(0.0, (stop - a.started_at).total_seconds())
    nodes: list[str] = []
    if attempts:
        parts = sorted(attempts[-1].parts.all(), key=lambda p: p.node_rank)
        nodes = [p.node.name for p in parts] or [attempts[-1].node.name]
    history = {
        "elapsed_s": None if last is None else max(0.0, (end - last).total_seconds()),
        "queue_wait_s": max(0.0, ((first or end) - job.submitted_at).total_seconds()),
        "gpu_hours": round(gpu_s / 3600.0, 4),
        "nodes": nodes,
    }
    job._history = history  # type: ignore[attr-defined]
    return history


def job_for_user(user: Any, job_id: Any) -> Job:
    """The job ``job_id`` if ``user`` may see it; ``Http404`` otherwise (also for bad ids)."""
    try:
        pk = int(job_id)
    except (TypeError, ValueError):
        raise Http404("no such job") from None
    job = jobs_visible_to(user).filter(pk=pk).first()
    if job is None:
        raise Http404(f"job {pk} not found")
    return job


def job_attempts(job: Job) -> list[Placement]:
    """Every attempt of the job (its placements, first attempt first) with their parts, using
    the prefetch of ``jobs_visible_to`` when present."""
    prefetched = getattr(job, "placements_newest_first", None)
    if prefetched is not None:
        return sorted(prefetched, key=lambda p: p.attempt)
    return list(job.placements.order_by("attempt").prefetch_related("parts__node"))


def job_placement(job: Job) -> Placement | None:
    """The job's active placement, else its last one (a finished or requeued job: where it ran
    last); None if it was never placed. Uses the prefetch of ``jobs_visible_to`` when present."""
    prefetched = getattr(job, "placements_newest_first", None)
    if prefetched is not None:
        return prefetched[0] if prefetched else None
    return (
        job.placements.select_related("node")
        .prefetch_related("gpus")
        .order_by("-active", "-id")
        .first()
    )


def job_events(job: Job) -> QuerySet[JobEvent]:
    """The job's timeline, oldest first."""
    return job.events.order_by("at", "id")


def profiles_visible_to(
    user: Any, *, status: str | None = None, kind: str | None = None, search: str | None = None
) -> QuerySet[ApplicationProfile]:
    """Profiles ``user`` may read: approved ones for everybody, all of them for staff."""
    qs = ApplicationProfile.objects.prefetch_related("gpu_times", "memory_steps")
    if not getattr(user, "is_staff", False):
        qs = qs.filter(status=ApplicationProfile.Status.APPROVED)
    if status:
        qs = qs.filter(status=status)
    if kind:
        qs = qs.filter(kind=kind)
    if search:
        qs = qs.filter(name__icontains=search.strip())
    return qs.order_by("name", "version")


def approved_profiles() -> QuerySet[ApplicationProfile]:
    """Profiles a job may reference (submission forms list these)."""
    return ApplicationProfile.objects.filter(status=ApplicationProfile.Status.APPROVED).order_by(
        "name", "version"
    )


def profile_for_user(user: Any, profile_id: Any) -> ApplicationProfile:
    try:
        pk = int(profile_id)
    except (TypeError, ValueError):
        raise Http404("no such profile") from None
    profile = profiles_visible_to(user).filter(pk=pk).first()
    if profile is None:
        raise Http404(f"profile {pk} not found")
    return profile


def nodes_with_gpus() -> QuerySet[Node]:
    return Node.objects.prefetch_related("gpus").order_by("name")


def gpus_all() -> QuerySet[Gpu]:
    return Gpu.objects.select_related("node").order_by("node__name", "index")


def queue_for(user: Any, *, limit: int = 50) -> tuple[list[dict[str, Any]], int]:
    """The queue (PENDING jobs, oldest first, as the loop hands them to the policy) as ``user``
    may see it: every job's position, resources, submission time and waiting reason; the name
    and owner only of the user's own jobs (staff: of every job). Returns ``(rows, total)``."""
    qs = (
        Job.objects.filter(state=JobState.PENDING)
        .select_related("owner", "project")
        .order_by("submitted_at", "id")
    )
    total = qs.count()
    rows = []
    project_ids = project_ids_of(user)
    for position, job in enumerate(qs[:limit], 1):
        visible = can_see_job(user, job, project_ids)
        rows.append(
            {
                "position": position,
                "id": job.pk if visible else None,
                "name": job.name if visible else None,
                "owner": job.owner.get_username() if visible else None,
                "project": job.project.name if visible and job.project else None,
                "mine": job.owner_id == user.pk,
                "gpus": job.gpus,
                "cpus": job.cpus,
                "priority": job.priority,
                "submitted_at": job.submitted_at,
                "waiting_reason": job.waiting_reason,
            }
        )
    return rows, total
