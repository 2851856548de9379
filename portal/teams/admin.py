"""Admin for projects: members with roles, quotas per GPU model, shares."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Count, QuerySet
from django.http import HttpRequest

from portal.teams.models import Membership, Project, ProjectQuota


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]
    fields = ["user", "role", "is_default"]


class QuotaInline(admin.TabularInline):
    model = ProjectQuota
    extra = 1
    fields = ["gpu_model", "guaranteed_gpus", "borrow_limit_gpus"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "personal_of", "shares", "member_count", "quota_summary"]
    search_fields = ["name", "description", "memberships__user__username"]
    list_filter = [("personal_of", admin.EmptyFieldListFilter)]
    inlines = [MembershipInline, QuotaInline]
    readonly_fields = ["created_at"]
    raw_id_fields = ["personal_of"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Project]:
        return (
            super()
            .get_queryset(request)
            .annotate(n_members=Count("memberships", distinct=True))
            .prefetch_related("quotas")
        )

    @admin.display(description="members", ordering="n_members")
    def member_count(self, project: Project) -> int:
        return getattr(project, "n_members", 0)

    @admin.display(description="quotas (guaranteed + borrowing limit)")
    def quota_summary(self, project: Project) -> str:
        return ", ".join(str(q).split(": ", 1)[1] for q in project.quotas.all()) or "-"


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "project", "role", "is_default"]
    list_filter = ["role", "is_default"]
    search_fields = ["user__username", "project__name"]
    autocomplete_fields = ["user", "project"]
