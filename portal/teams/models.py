"""Projects (teams): members with roles, GPU quotas per model, shares for fair share.

Every job belongs to one project (``core.Job.project``): the one its owner chose at submission,
else the owner's default project (a membership marked default, else their personal project,
created on first use). Members of a project see its jobs. See docs/projects.md.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import IntegrityError, models, transaction
from django.db.models import Q

from portal.core.models import Gpu
from scheduler.catalog import UnknownGpuModel, canonical_model

PROJECT_NAME = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,99}$",
    "letters, digits and _ . @ + - (not first), at most 100 characters",
)


def _personal_name(username: str) -> str:
    base = "".join(c if c.isalnum() or c in "_.@+-" else "-" for c in username)[:90] or "user"
    if not base[0].isalnum():
        base = "u" + base
    name, n = base, 1
    while Project.objects.filter(name=name).exists():
        n += 1
        name = f"{base}-personal" if n == 2 else f"{base}-personal{n - 1}"
    return name


class ProjectManager(models.Manager["Project"]):
    # Here rather than in services so that ``core.Job.save`` can fill a job's project through
    # its own foreign key (``Job.project``) without importing the teams app: the core models
    # sit below teams (``ProjectQuota.clean`` reads ``core.Gpu``), never the other way round.

    def personal_for(self, user: Any) -> Project:
        """The user's personal project (they manage it), created on first use."""
        existing = self.filter(personal_of=user).first()
        if existing is not None:
            return existing
        try:
            with transaction.atomic():
                project = self.create(
                    name=_personal_name(user.get_username()),
                    personal_of=user,
                    description=f"personal project of {user.get_username()}",
                )
                Membership.objects.create(project=project, user=user, role=Membership.Role.MANAGER)
        except IntegrityError:  # created concurrently
            return self.get(personal_of=user)
        return project

    def default_for(self, user: Any) -> Project:
        """Where ``user``'s jobs go when they name no project: the membership marked default,
        else their personal project."""
        # One query for both candidates (a user has at most one default membership, and it
        # may be of the personal project itself): a project that is not the personal one can
        # only have come through the default membership, so it wins.
        candidates = list(
            self.filter(
                Q(memberships__user=user, memberships__is_default=True) | Q(personal_of=user)
            ).distinct()[:2]
        )
        for project in candidates:
            if project.personal_of_id != user.pk:
                return project
        if candidates:
            return candidates[0]
        return self.personal_for(user)


class Project(models.Model):
    name = models.CharField(max_length=100, unique=True, validators=[PROJECT_NAME])
    description = models.TextField(blank=True)
    personal_of = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="personal_project",
        help_text="set for a user's personal project (created on their first job)",
    )
    shares = models.FloatField(
        default=1.0, help_text="fair-share weight against other projects (1 = an even share)"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ProjectManager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        MEMBER = "member", "Member"
        MANAGER = "manager", "Manager"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="project_memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    is_default = models.BooleanField(
        default=False, help_text="the user's jobs go here unless they name another project"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project__name", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="membership_unique"),
            models.UniqueConstraint(
                fields=["user"], condition=Q(is_default=True), name="one_default_project_per_user"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


class ProjectQuota(models.Model):
    """GPUs of one model a project is guaranteed, and how many more it may borrow while others
    leave them idle (empty: no limit). Enforced by the ``quota`` policy."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="quotas")
    gpu_model = models.CharField(max_length=40, help_text="catalogue name, e.g. V100, A30")
    guaranteed_gpus = models.PositiveIntegerField(default=0)
    borrow_limit_gpus = models.PositiveIntegerField(
        null=True, blank=True, help_text="GPUs beyond the guarantee it may borrow; empty: any"
    )

    class Meta:
        ordering = ["project__name", "gpu_model"]
        constraints = [
            models.UniqueConstraint(fields=["project", "gpu_model"], name="quota_project_model")
        ]

    def clean(self) -> None:
        """The GPU model is a catalogue name or the model of a registered GPU (stored in the
        catalogue's spelling, so the scheduler matches it)."""
        try:
            self.gpu_model = canonical_model(self.gpu_model)
        except UnknownGpuModel:
            if not Gpu.objects.filter(model=self.gpu_model).exists():
                known = sorted(set(Gpu.objects.values_list("model", flat=True)))
                raise ValidationError(
                    {
                        "gpu_model": f"unknown GPU model {self.gpu_model!r}; the cluster has "
                        f"{', '.join(known) or 'no GPUs yet'}"
                    }
                ) from None

    def __str__(self) -> str:
        limit = "any" if self.borrow_limit_gpus is None else self.borrow_limit_gpus
        return f"{self.project}: {self.guaranteed_gpus} {self.gpu_model} (+{limit})"
