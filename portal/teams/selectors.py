"""Project reads: which projects a user belongs to, whose jobs they may see."""

from __future__ import annotations

from typing import Any

from portal.teams.models import Membership


def project_ids_of(user: Any) -> set[int]:
    """Ids of the projects ``user`` is a member of (their jobs are visible to ``user``)."""
    if user is None or not getattr(user, "is_authenticated", False):
        return set()
    return set(Membership.objects.filter(user=user).values_list("project_id", flat=True))


def can_see_job(user: Any, job: Any, project_ids: set[int] | None = None) -> bool:
    """Staff, the owner and members of the job's project see a job (name, owner, details)."""
    if getattr(user, "is_staff", False) or job.owner_id == user.pk:
        return True
    ids = project_ids_of(user) if project_ids is None else project_ids
    return job.project_id is not None and job.project_id in ids


def can_control_job(user: Any, job: Any) -> bool:
    """Staff, the owner and managers of the job's project may cancel, pause or resume it;
    other members only see it."""
    if getattr(user, "is_staff", False) or job.owner_id == user.pk:
        return True
    return (
        job.project_id is not None
        and Membership.objects.filter(
            user=user, project_id=job.project_id, role=Membership.Role.MANAGER
        ).exists()
    )
