"""Project writes and the lookups submission needs (docs/projects.md)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet

from portal.teams.models import Membership, Project


def personal_project(user: Any) -> Project:
    """The user's personal project (they manage it), created on first use."""
    return Project.objects.personal_for(user)


def default_project(user: Any) -> Project:
    """Where ``user``'s jobs go when they name no project: the membership marked default, else
    their personal project."""
    return Project.objects.default_for(user)


def projects_of(user: Any) -> QuerySet[Project]:
    """Projects ``user`` is a member of, by name."""
    return Project.objects.filter(memberships__user=user).order_by("name").distinct()


def project_for_submission(user: Any, name: Any) -> Project:
    """The project a job of ``user`` goes to: ``name`` (a project they belong to) or, when
    ``name`` is empty, their default. Raises ``ValidationError({"project": [...]})`` otherwise."""
    if name in (None, ""):
        return default_project(user)
    if isinstance(name, Project):
        name = name.name
    project = projects_of(user).filter(name=str(name)).first()
    if project is None:
        default_project(user)  # so the list below is never empty
        mine = ", ".join(projects_of(user).values_list("name", flat=True))
        raise ValidationError(
            {"project": [f"you are not a member of a project called {name!r}; yours: {mine}"]}
        )
    return project


def project_member_set(
    project: Project, user: Any, role: str = Membership.Role.MEMBER
) -> Membership:
    """Add ``user`` to ``project`` with ``role`` (or change their role)."""
    membership, _ = Membership.objects.update_or_create(
        project=project, user=user, defaults={"role": role}
    )
    return membership


def project_default_set(user: Any, project: Project) -> None:
    """Make ``project`` (one ``user`` belongs to) their default."""
    with transaction.atomic():
        Membership.objects.filter(user=user, is_default=True).update(is_default=False)
        updated = Membership.objects.filter(user=user, project=project).update(is_default=True)
        if not updated:
            raise ValidationError({"project": [f"not a member of {project.name}"]})
