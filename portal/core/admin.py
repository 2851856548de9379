"""Django admin: the curation tool for profiles (edit, approve, retire, import), and read-mostly
views of jobs, the cluster, metrics and the policy settings. Writes go through services."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from portal.core import policy_settings, services
from portal.core.adapters import derived_classes
from portal.core.importers import FORMATS, ProfileImportError, memory_max_error
from portal.core.models import (
    JOB_KINDS,
    ApplicationProfile,
    Gpu,
    Job,
    JobEvent,
    MetricSample,
    Node,
    Placement,
    PolicySettings,
    ProfileGpuTime,
    ProfileMemoryStep,
)
from portal.core.policy_settings import ParamSpec
from portal.core.states import IllegalTransition
from scheduler.policies.registry import available_policies
from workers.protocol import loads_bounded

DASH = "—"


class ProfileGpuTimeInline(admin.TabularInline):
    model = ProfileGpuTime
    extra = 0
    fields = ["gpu_model", "time_s"]


class _MemoryStepFormSet(forms.BaseInlineFormSet):
    """The steps as saved must not climb above the profile's declared GPU memory maximum."""

    def clean(self) -> None:
        super().clean()
        steps = [
            (
                f.cleaned_data.get("start_fraction") or 0.0,
                f.cleaned_data["from_mb"],
                f.cleaned_data["to_mb"],
            )
            for f in self.forms
            if f.cleaned_data
            and not f.cleaned_data.get("DELETE")
            and f.cleaned_data.get("from_mb") is not None
            and f.cleaned_data.get("to_mb") is not None
        ]
        problem = memory_max_error(self.instance.gpu_memory_max_mb, steps)
        if problem:
            raise forms.ValidationError(f"GPU memory max: {problem}")


class ProfileMemoryStepInline(admin.TabularInline):
    model = ProfileMemoryStep
    formset = _MemoryStepFormSet
    extra = 0
    fields = ["index", "start_fraction", "from_mb", "to_mb"]


class ProfileImportForm(forms.Form):
    file = forms.FileField(help_text="CSV or JSON (our schema), nvprof or Nsight Compute CSV")
    format = forms.ChoiceField(
        choices=[("", "detect from the file"), *((f, f) for f in FORMATS)], required=False
    )
    status = forms.ChoiceField(
        choices=ApplicationProfile.Status.choices, initial=ApplicationProfile.Status.DRAFT
    )
    update_existing = forms.BooleanField(
        required=False, help_text="overwrite profiles whose name and version already exist"
    )
    name = forms.CharField(required=False, help_text="profile name (nvprof / Nsight Compute)")
    version = forms.CharField(required=False)
    kind = forms.ChoiceField(choices=[("", "—"), *JOB_KINDS], required=False)


def _classes(obj: ApplicationProfile) -> dict[str, str | None]:
    cached = getattr(obj, "_derived_classes", None)
    if cached is None:
        try:
            cached = derived_classes(obj)
        except Exception:  # the admin page must render even if a class function breaks
            cached = {}
        obj._derived_classes = cached
    return cached


@admin.register(ApplicationProfile)
class ApplicationProfileAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "version",
        "kind",
        "status",
        "source",
        "cpu_time_s",
        "gpu_memory_max_mb",
        "kernel_class",
        "cm_class",
        "scale_class",
        "updated_at",
    ]
    list_filter = ["status", "kind", "source"]
    search_fields = ["name", "description", "dataset"]
    inlines = [ProfileGpuTimeInline, ProfileMemoryStepInline]
    actions = ["approve", "retire"]
    readonly_fields = [
        "kernel_class",
        "cm_class",
        "scale_class",
        "sensitivity_class",
        "approved_by",
        "approved_at",
        "created_by",
        "created_at",
        "updated_at",
    ]
    fieldsets = [
        (None, {"fields": ["name", "version", "kind", "status", "source", "description"]}),
        (
            "Sources (field -> where its number comes from; shown on the profile page)",
            {"fields": ["sources"], "classes": ["collapse"]},
        ),
        (
            "Derived classes (computed by scheduler.classes, not stored)",
            {"fields": ["kernel_class", "cm_class", "scale_class", "sensitivity_class"]},
        ),
        ("Input parameters", {"fields": ["batch_size", "image_size", "dataset", "args"]}),
        (
            "Run time and memory",
            {
                "fields": [
                    "cpu_time_s",
                    "gpu_memory_max_mb",
                    "gpu_memory_avg_mb",
                    "default_time_limit_s",
                ]
            },
        ),
        (
            "Utilisation",
            {
                "fields": [
                    "gpu_util_pct",
                    "sm_efficiency_pct",
                    "warp_efficiency_pct",
                    "ipc",
                    "occupancy_pct",
                    "mem_util_pct",
                    "h2d_gbps",
                    "d2h_gbps",
                    "gld_gbps",
                    "gst_gbps",
                    "dram_bw_gbps",
                    "gflops",
                ]
            },
        ),
        (
            "Kernels and stall reasons",
            {
                "fields": [
                    "stall_exec_dependency_pct",
                    "stall_instruction_fetch_pct",
                    "stall_memory_dependency_pct",
                    "stall_texture_pct",
                    "stall_synchronization_pct",
                    "stall_other_pct",
                    "epc",
                    "registers_per_block",
                    "smem_per_block_bytes",
                    "l1_transactions",
                    "saturation_tbs_per_sm",
                ]
            },
        ),
        ("Job descriptors", {"fields": ["cm_ratio", "sensitivity"]}),
        (
            "History",
            {
                "fields": ["created_by", "created_at", "approved_by", "approved_at", "updated_at"],
                "classes": ["collapse"],
            },
        ),
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[ApplicationProfile]:
        return super().get_queryset(request).prefetch_related("gpu_times", "memory_steps")

    @admin.display(description="kernel class")
    def kernel_class(self, obj: ApplicationProfile) -> str:
        return _classes(obj).get("kernel_class") or DASH

    @admin.display(description="C/M class")
    def cm_class(self, obj: ApplicationProfile) -> str:
        return _classes(obj).get("cm_class") or DASH

    @admin.display(description="scale class")
    def scale_class(self, obj: ApplicationProfile) -> str:
        return _classes(obj).get("scale_class") or DASH

    @admin.display(description="sensitivity class")
    def sensitivity_class(self, obj: ApplicationProfile) -> str:
        return _classes(obj).get("sensitivity_class") or DASH

    def save_model(
        self, request: HttpRequest, obj: ApplicationProfile, form: Any, change: bool
    ) -> None:
        if not change and obj.created_by is None:
            obj.created_by = request.user
        status_changed = "status" in form.changed_data
        super().save_model(request, obj, form, change)
        if status_changed and obj.status == ApplicationProfile.Status.APPROVED:
            services.profile_approve(obj, actor=request.user)

    @admin.action(description="Approve selected profiles")
    def approve(self, request: HttpRequest, queryset: QuerySet[ApplicationProfile]) -> None:
        for profile in queryset:
            services.profile_approve(profile, actor=request.user)
        self.message_user(request, f"Approved {queryset.count()} profile(s).", messages.SUCCESS)

    @admin.action(description="Retire selected profiles")
    def retire(self, request: HttpRequest, queryset: QuerySet[ApplicationProfile]) -> None:
        for profile in queryset:
            services.profile_retire(profile, actor=request.user)
        self.message_user(request, f"Retired {queryset.count()} profile(s).", messages.SUCCESS)

    def get_urls(self) -> list[Any]:
        custom = [
            path(
                "import/",
                self.admin_site.admin_view(self.import_view),
                name="core_applicationprofile_import",
            )
        ]
        return custom + super().get_urls()

    def import_view(self, request: HttpRequest) -> HttpResponse:
        """Upload a profile file; all or nothing, with every row error listed."""
        if not self.has_add_permission(request):
            return HttpResponseRedirect(reverse("admin:index"))
        errors = []
        if request.method == "POST":
            form = ProfileImportForm(request.POST, request.FILES)
            if form.is_valid():
                data = form.cleaned_data
                upload = data["file"]
                options = {k: data[k] for k in ("name", "version", "kind") if data.get(k)}
                try:
                    result = services.profile_import(
                        upload.read(),
                        actor=request.user,
                        fmt=data["format"] or None,
                        filename=upload.name,
                        status=data["status"],
                        update_existing=data["update_existing"],
                        options=options,
                    )
                except ProfileImportError as exc:
                    errors = exc.errors
                    self.message_user(
                        request,
                        f"Nothing imported: {len(errors)} error(s) in {upload.name}.",
                        messages.ERROR,
                    )
                else:
                    self.message_user(
                        request,
                        f"Imported {upload.name}: {len(result.created)} created, "
                        f"{len(result.updated)} updated ({data['status']}).",
                        messages.SUCCESS,
                    )
                    return HttpResponseRedirect(reverse("admin:core_applicationprofile_changelist"))
        else:
            form = ProfileImportForm()
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Import profiles",
            "form": form,
            "errors": errors,
        }
        return TemplateResponse(request, "admin/core/applicationprofile/import.html", context)


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    fields = ["at", "from_state", "to_state", "actor", "message"]
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class PlacementInline(admin.TabularInline):
    """The job's attempts (docs/reliability.md)."""

    model = Placement
    verbose_name = "attempt"
    extra = 0
    can_delete = False
    fields = [
        "attempt",
        "node",
        "sharing_mode",
        "mps_percentage",
        "mig_profile",
        "policy",
        "explanation",
        "active",
        "created_at",
        "started_at",
        "released_at",
        "outcome",
        "end_reason",
    ]
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    """Read-mostly: jobs change state only through the state machine (action: cancel)."""

    list_display = [
        "id",
        "name",
        "owner",
        "project",
        "state",
        "kind",
        "gpus",
        "priority",
        "submitted_at",
    ]
    list_filter = ["state", "kind", "project"]
    search_fields = ["name", "owner__username", "command", "project__name"]
    date_hierarchy = "submitted_at"
    list_select_related = ["owner", "project"]
    inlines = [PlacementInline, JobEventInline]
    actions = ["cancel"]
    editable_fields = ["priority"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in Job._meta.concrete_fields if f.name not in self.editable_fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Cancel selected jobs")
    def cancel(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        done, skipped = 0, 0
        for job in queryset:
            try:
                services.job_cancel(job, actor=f"admin:{request.user.get_username()}")
                done += 1
            except IllegalTransition:
                skipped += 1
        self.message_user(
            request, f"Cancelled {done} job(s); {skipped} had already finished.", messages.INFO
        )


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = [
        "index",
        "model",
        "architecture",
        "memory_mb",
        "sm_count",
        "sharing_modes",
        "mig_profiles",
        "current_mode",
        "uuid",
    ]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "kind",
        "backend",
        "cores",
        "memory_mb",
        "status",
        "last_heartbeat",
        "gpu_count",
    ]
    list_filter = ["kind", "status", "backend"]
    search_fields = ["name"]
    inlines = [GpuInline]
    # What the agent reports and the lease machinery keeps is read, not edited; status changes
    # go through drain / down / resume (cluster page, API, ``cosched nodes drain``).
    readonly_fields = [
        "status",
        "last_heartbeat",
        "lease_expires_at",
        "sync_seq",
        "agent_instance",
        "isolation",
        "state_reason",
        "state_changed_by",
        "state_changed_at",
        "held_down",
        "created_at",
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Node]:
        return super().get_queryset(request).prefetch_related("gpus")

    @admin.display(description="GPUs")
    def gpu_count(self, obj: Node) -> int:
        return len(obj.gpus.all())


PARAM_PREFIX = "param__"


def _param_field(spec: ParamSpec, initial: Any) -> forms.Field:
    """A typed form field for one documented policy parameter (blank: its default)."""
    help_text = (
        f"{spec.help + '. ' if spec.help else ''}{spec.describe()}; default {spec.default!r}"
    )
    common: dict[str, Any] = {
        "required": False,
        "label": spec.name,
        "help_text": help_text,
        "initial": initial,
    }
    if spec.kind == policy_settings.BOOL:
        return forms.BooleanField(**common)
    if spec.kind == policy_settings.INT:
        return forms.IntegerField(min_value=spec.minimum, max_value=spec.maximum, **common)
    if spec.kind == policy_settings.FLOAT:
        return forms.FloatField(min_value=spec.minimum, max_value=spec.maximum, **common)
    if spec.kind == policy_settings.CHOICE:
        blank = (
            "null (off)" if spec.nullable and spec.default is None else f"default ({spec.default})"
        )
        if spec.nullable and spec.default is not None:
            choices = [("", blank), ("null", "null (off)")]
        else:
            choices = [("", blank)]
        return forms.ChoiceField(choices=choices + [(c, c) for c in spec.choices], **common)
    if spec.kind == policy_settings.TEXT:
        return forms.CharField(max_length=500, strip=True, **common)
    common["initial"] = "" if initial is None else json.dumps(initial, indent=2)
    return forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60, "class": "vLargeTextField"}), **common
    )


class PolicySettingsForm(forms.ModelForm):
    """A registered policy, and a typed field per documented parameter of it (types, ranges,
    help), all checked on save by ``policy_settings.validate_policy_settings``: building the
    policy and planning one cycle of the current queue with it."""

    policy = forms.ChoiceField(
        help_text=(
            "A registered policy (docs site: Policies). Choosing another one reloads the form "
            "with that policy's own parameters."
        )
    )

    class Meta:
        model = PolicySettings
        fields = ["name", "policy", "active"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["policy"].choices = [(p, p) for p in available_policies()]
        requested = getattr(self, "requested_policy", None)  # ?policy= (the select's reload)
        if self.is_bound:
            chosen = self.data.get("policy") or "fifo"
        else:
            chosen = requested or self.instance.policy or "fifo"
            self.initial["policy"] = chosen
        try:
            self.specs = policy_settings.policy_parameters(chosen)
        except Exception:  # an unknown policy: the choice field reports it
            self.specs = []
        current = dict(self.instance.params or {}) if self.instance.pk else {}
        self.initial_params = dict(current)  # what was stored (save_model compares)
        for spec in self.specs:
            initial = current.get(spec.name, spec.default)
            if spec.kind == policy_settings.CHOICE:
                initial = (
                    "" if initial == spec.default else ("null" if initial is None else initial)
                )
            self.fields[PARAM_PREFIX + spec.name] = _param_field(spec, initial)

    def param_fields(self) -> list[Any]:
        return [self[PARAM_PREFIX + spec.name] for spec in self.specs]

    def _value(self, spec: ParamSpec) -> Any:
        raw = self.cleaned_data.get(PARAM_PREFIX + spec.name)
        if spec.kind == policy_settings.CHOICE:
            if raw in ("", None):
                return spec.default
            return None if raw == "null" else raw
        if spec.kind == policy_settings.MAPPING:
            text = (raw or "").strip()
            if not text:
                return spec.default
            try:
                value = loads_bounded(text)  # a 10,000-deep value is an error, not a 500
            except ValueError as exc:
                raise forms.ValidationError(f"not valid JSON: {exc}") from None
            if not isinstance(value, dict):
                raise forms.ValidationError('must be a JSON object, e.g. {"a": 1}')
            return value
        if raw in (None, "") and spec.kind != policy_settings.BOOL:
            return spec.default
        return raw

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        policy = cleaned.get("policy")
        if not policy:
            return cleaned
        params: dict[str, Any] = {}
        for spec in self.specs:
            key = PARAM_PREFIX + spec.name
            if key in self.errors:
                continue
            try:
                value = self._value(spec)
            except forms.ValidationError as exc:
                self.add_error(key, exc)
                continue
            if value != spec.default:
                params[spec.name] = value
        if self.errors:
            return cleaned
        for name, message in policy_settings.validate_policy_settings(policy, params).items():
            field = PARAM_PREFIX + name if PARAM_PREFIX + name in self.fields else name
            self.add_error(field if field in self.fields else None, message)
        self.instance.params = params
        return cleaned


@admin.register(PolicySettings)
class PolicySettingsAdmin(admin.ModelAdmin):
    form = PolicySettingsForm
    list_display = ["name", "policy", "active", "parameters", "validity", "updated_at"]
    list_filter = ["active"]
    change_form_template = "admin/core/policysettings/change_form.html"

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        if request.method == "POST":
            policy = request.POST.get("policy") or "fifo"
        else:
            policy = request.GET.get("policy") or (obj.policy if obj is not None else "fifo")
        try:
            specs = policy_settings.policy_parameters(policy)
        except Exception:  # an unknown policy: no parameter fields, the choice reports it
            specs = []
        names = [PARAM_PREFIX + spec.name for spec in specs]
        return [
            (None, {"fields": ["name", "policy", "active"]}),
            (
                f"Parameters of {policy} (blank: the documented default)",
                {"fields": names},
            ),
        ]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any):
        kwargs["fields"] = None  # the parameter fields are built per policy by the form
        form = super().get_form(request, obj, change=change, **kwargs)
        form.requested_policy = request.GET.get("policy")
        return form

    def save_model(
        self, request: HttpRequest, obj: PolicySettings, form: Any, change: bool
    ) -> None:
        """A changed configuration starts with no run-time error: the error shown was the old
        one's (the loop sets it again if the new one fails too)."""
        if "policy" in form.changed_data or obj.params != form.initial_params:
            obj.runtime_error, obj.runtime_error_at, obj.runtime_fallback = "", None, ""
        super().save_model(request, obj, form, change)

    @admin.display(description="parameters")
    def parameters(self, obj: PolicySettings) -> str:
        return json.dumps(obj.params or {}, sort_keys=True) if obj.params else "defaults"

    @admin.display(description="check")
    def validity(self, obj: PolicySettings) -> str:
        errors = policy_settings.validate_policy_settings(obj.policy, obj.params, trial=False)
        text = "ok" if not errors else "; ".join(f"{k}: {v}" for k, v in errors.items())
        if obj.runtime_error:
            text = f"{'' if errors else 'valid, but '}failed at run time: {obj.runtime_error}" + (
                f" (running {obj.runtime_fallback} instead)" if obj.runtime_fallback else ""
            )
        return text


@admin.register(MetricSample)
class MetricSampleAdmin(admin.ModelAdmin):
    """Read-only: samples come from the node agents."""

    list_display = ["at", "metric", "value", "node", "gpu", "job"]
    list_filter = ["metric"]
    date_hierarchy = "at"
    list_select_related = ["node", "gpu__node", "job"]
    raw_id_fields = ["node", "gpu", "job"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
