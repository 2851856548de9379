"""Browser forms. They type-check and shape input; business rules stay in the services."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

from django import forms

from portal.core import jobcontrol, selectors, services, validation
from portal.core.models import JOB_KINDS, ApplicationProfile
from portal.core.states import JobState

# Fields the form passes to ``job_submit`` (the API's job contract plus the model's extras).
JOB_FIELDS = (
    "name",
    "command",
    "container_image",
    "profile",
    "kind",
    "gpus",
    "gpu_memory_mb",
    "cpus",
    "memory_mb",
    "sharing",
    "device",
    "priority",
    "params",
    "elastic_min_workers",
    "elastic_max_workers",
    "elastic_deadline_s",
    "elastic_value_per_hour",
    "max_global_batch",
    "time_limit_s",
)


def profile_defaults(profile: ApplicationProfile) -> dict[str, Any]:
    """What a job running ``profile`` asks for unless the user says otherwise.

    One GPU if the profile was measured on a GPU (a GPU time or GPU memory is known), else a
    CPU-only job; GPU memory per GPU is the profiled maximum (MB, rounded up); parameters are the
    inputs the profile was measured with.
    """
    on_gpu = profile.gpu_memory_max_mb is not None or bool(profile.gpu_times.all())
    # the declared maximum, or the memory steps' peak if that is higher (older profiles)
    peaks = [max(s.from_mb, s.to_mb) for s in profile.memory_steps.all()]
    memory_mb = max([profile.gpu_memory_max_mb or 0.0, *peaks]) or None
    params: dict[str, Any] = {}
    for key in ("batch_size", "image_size", "dataset"):
        value = getattr(profile, key)
        if value not in (None, ""):
            params[key] = value
    params.update(profile.args or {})
    return {
        "kind": profile.kind,
        "gpus": 1 if on_gpu else 0,
        "gpu_memory_mb": math.ceil(memory_mb) if on_gpu and memory_mb is not None else None,
        "params": params,
    }


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _bounded(name: str, **kwargs: Any) -> forms.IntegerField:
    """An integer field within ``validation.LIMITS[name]``."""
    low, high = validation.LIMITS[name]
    return forms.IntegerField(min_value=low, max_value=high, **kwargs)


class JsonObjectField(forms.CharField):
    """A textarea holding a JSON object; cleans to a dict (blank means ``{}``)."""

    widget = forms.Textarea(attrs={"rows": 5, "spellcheck": "false", "class": "mono"})

    def to_python(self, value: Any) -> dict[str, Any]:
        text = (super().to_python(value) or "").strip()
        if not text:
            return {}
        depth = validation.json_nesting_depth(text)
        if depth > validation.JSON_MAX_DEPTH:
            raise forms.ValidationError(
                f"nested {depth} levels deep; at most {validation.JSON_MAX_DEPTH}"
            )
        try:
            parsed = json.loads(text, parse_constant=_no_constant)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
            ) from None
        except (ValueError, RecursionError) as exc:
            raise forms.ValidationError(f"not valid JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise forms.ValidationError('must be a JSON object, e.g. {"epochs": 10}')
        problem = validation.json_error(parsed)
        if problem:
            raise forms.ValidationError(problem)
        return parsed

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, dict):
            return json.dumps(value, indent=2) if value else ""
        return value


class JobSubmitForm(forms.Form):
    name = forms.CharField(max_length=200, widget=forms.TextInput(attrs={"autofocus": True}))
    profile = forms.ModelChoiceField(
        queryset=ApplicationProfile.objects.none(),
        required=False,
        empty_label="No profile: I give the resources",
        help_text="Approved profiles only. A profile fills in blank resources below.",
    )
    command = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false", "class": "mono"}),
        help_text="Run on the node, e.g. python train.py --epochs 10",
    )
    container_image = forms.CharField(
        max_length=300, required=False, help_text="Optional, e.g. nvcr.io/nvidia/pytorch:24.05"
    )
    kind = forms.ChoiceField(choices=[("", "From profile"), *JOB_KINDS], required=False)
    gpus = _bounded(
        "gpus", label="GPUs", required=False, help_text="0 = CPU only. Blank: from profile."
    )
    gpu_memory_mb = _bounded(
        "gpu_memory_mb",
        label="GPU memory (MB)",
        required=False,
        help_text="Per GPU. Blank: the profile's maximum.",
    )
    cpus = _bounded("cpus", label="CPUs", initial=1, required=False)
    memory_mb = _bounded(
        "memory_mb",
        label="Host memory (MB)",
        required=False,
        help_text="Reserved on the node; the job is stopped if it uses more. Blank: not limited.",
    )
    sharing = forms.CharField(
        max_length=40,
        required=False,
        label="GPU sharing",
        widget=forms.TextInput(attrs={"list": "sharing-choices", "placeholder": "site default"}),
        help_text=(
            "never (GPUs of its own), allowed, mps, time_slicing or a MIG profile (1g.6gb). "
            "Blank: the site default. A job whose GPU memory is unknown is never packed."
        ),
    )
    device = forms.ChoiceField(
        choices=[
            ("", "From GPUs (gpu, or cpu for 0 GPUs)"),
            ("gpu", "gpu: GPUs only"),
            ("auto", "auto: a CPU node where the policy finds it better"),
            ("cpu", "cpu: CPU only"),
        ],
        required=False,
        label="Device",
    )
    priority = _bounded(
        "priority",
        initial=0,
        required=False,
        help_text="-1000 to 1000; higher runs first under priority-aware policies.",
    )
    elastic_min_workers = _bounded("elastic_min_workers", required=False, label="Elastic min")
    elastic_max_workers = _bounded("elastic_max_workers", required=False, label="Elastic max")
    elastic_deadline_s = _bounded(
        "elastic_deadline_s",
        required=False,
        label="Elastic deadline (s)",
        help_text="Elastic jobs: finish within this many seconds of the start (or a value).",
    )
    elastic_value_per_hour = forms.FloatField(
        min_value=validation.FLOAT_LIMITS["elastic_value_per_hour"][0],
        max_value=validation.FLOAT_LIMITS["elastic_value_per_hour"][1],
        required=False,
        label="Elastic value per hour",
        help_text="Elastic jobs: GPU-hours that finishing one hour sooner is worth.",
    )
    max_global_batch = _bounded(
        "max_global_batch",
        required=False,
        label="Max global batch",
        help_text="Elastic jobs: the local batch grows with fewer workers up to this global batch.",
    )
    time_limit = forms.CharField(
        required=False,
        max_length=40,
        help_text=(
            "Per attempt: 90s, 30m, 2h, 1-00:00:00 or seconds. Past it the job is stopped and "
            "ends FAILED (time limit). Blank: the profile's default, if any."
        ),
    )
    params = JsonObjectField(
        label="Parameters (JSON)",
        required=False,
        help_text='A JSON object, e.g. {"batch_size": 64, "epochs": 10}',
    )
    project = forms.ChoiceField(
        choices=[("", "My default project")],
        required=False,
        help_text="The project (team) the job is accounted to; its members see the job.",
    )
    # Job control (docs/job-control.md)
    dependencies = forms.CharField(
        required=False,
        max_length=2000,
        help_text="Jobs of yours to wait for, e.g. afterok:812 (also after, afternotok, afterany).",
    )
    array = forms.CharField(
        required=False,
        max_length=200,
        help_text='An array of tasks: "0-99%8" = 100 tasks, at most 8 at once; each gets '
        "COSCHED_ARRAY_TASK_ID.",
    )
    held = forms.BooleanField(
        required=False, label="Submit held", help_text="It does not start until you release it."
    )
    output = forms.CharField(
        required=False,
        max_length=1000,
        help_text="Output file in the work directory or an absolute path: %j job id, %a array "
        "index, %u user. Blank: cosched-%j.out.",
    )
    error = forms.CharField(
        required=False, max_length=1000, help_text="Standard error file. Blank: with the output."
    )
    # One per rendered form: a double-click or a resent POST returns the same job.
    submit_token = forms.CharField(widget=forms.HiddenInput, required=False)

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["profile"].queryset = selectors.approved_profiles()
        if user is not None:
            from portal.teams.services import default_project, projects_of

            default = default_project(user)
            self.fields["project"].choices = [
                (p.name, p.name + (" (default)" if p == default else "")) for p in projects_of(user)
            ]
            self.fields["project"].initial = default.name
        if not self.is_bound:
            self.initial.setdefault("submit_token", uuid.uuid4().hex)
        # Said before submit (docs/containers.md): what images may run, and where none can.
        field = self.fields["container_image"]
        field.help_text = validation.container_image_help()
        if not validation.container_runtime_available():
            field.widget.attrs["disabled"] = "disabled"

    def clean_time_limit(self) -> int | None:
        from scheduler.durations import DurationError, parse_duration

        text = (self.cleaned_data.get("time_limit") or "").strip()
        if not text:
            return None
        try:
            return parse_duration(text)
        except DurationError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_dependencies(self) -> list[dict[str, Any]]:
        try:
            return jobcontrol.parse_dependencies(self.cleaned_data.get("dependencies") or "")
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_array(self) -> jobcontrol.ArraySpec | None:
        text = (self.cleaned_data.get("array") or "").strip()
        if not text:
            return None
        try:
            return jobcontrol.parse_array(text)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_output(self) -> str:
        return _output_path(self.cleaned_data.get("output") or "")

    def clean_error(self) -> str:
        return _output_path(self.cleaned_data.get("error") or "")

    def clean(self) -> dict[str, Any]:
        """Add the service's business-rule errors to the type errors, so one round trip
        shows every problem (``job_submit`` checks the rules again on save)."""
        cleaned = super().clean()
        failed = set(self.errors)
        for field, messages in services.job_rule_errors(self.job_fields(), skip=failed).items():
            for message in messages:
                self.add_error(field if field in self.fields else None, message)
        return cleaned

    def profile_defaults(self) -> dict[int, dict[str, Any]]:
        """``profile_defaults`` of every selectable profile, for the page's small script."""
        profiles = self.fields["profile"].queryset.prefetch_related("gpu_times", "memory_steps")
        return {profile.pk: profile_defaults(profile) for profile in profiles}

    def filled_from_profile(self) -> dict[str, Any]:
        """The bound data with blank resource fields filled from the chosen profile (no save)."""
        data = self.data.copy()
        profile_id = data.get("profile")
        profiles = self.fields["profile"].queryset
        profile = profiles.filter(pk=profile_id).first() if str(profile_id).isdigit() else None
        if profile is not None:
            for key, value in profile_defaults(profile).items():
                if value in (None, {}) or str(data.get(key, "")).strip():
                    continue
                if key == "gpu_memory_mb" and str(data.get("gpus", "")).strip() == "0":
                    continue
                data[key] = json.dumps(value, indent=2) if key == "params" else value
        return data

    def job_fields(self) -> dict[str, Any]:
        """Cleaned values for ``job_submit``, blanks derived from the profile or defaulted."""
        cd = self.cleaned_data
        derived = profile_defaults(cd["profile"]) if cd.get("profile") else {}
        fields = {key: cd.get(key) for key in JOB_FIELDS}
        fields["time_limit_s"] = cd.get("time_limit")
        for key in ("kind", "gpus"):
            if fields[key] in (None, ""):
                fields[key] = derived.get(key)
        if fields["gpu_memory_mb"] is None and fields["gpus"]:
            fields["gpu_memory_mb"] = derived.get("gpu_memory_mb")
        if not fields["params"] and derived.get("params"):
            fields["params"] = derived["params"]
        fields["kind"] = fields["kind"] or "other"
        fields["gpus"] = fields["gpus"] if fields["gpus"] is not None else 0
        fields["cpus"] = fields["cpus"] or 1
        fields["priority"] = fields["priority"] or 0
        fields["command"] = fields["command"] or ""
        fields["container_image"] = fields["container_image"] or ""
        fields["sharing"] = (fields["sharing"] or "").strip()
        fields["device"] = fields["device"] or ""
        fields["project"] = self.cleaned_data.get("project") or None
        fields["dependencies"] = cd.get("dependencies") or []
        fields["held"] = bool(cd.get("held"))
        fields["output_path"] = cd.get("output") or ""
        fields["error_path"] = cd.get("error") or ""
        if cd.get("array"):
            fields["array"] = cd["array"]
        return fields


def _output_path(value: str) -> str:
    problems = jobcontrol.output_path_errors(value.strip())
    if problems:
        raise forms.ValidationError(problems)
    return value.strip()


class JobEditForm(forms.Form):
    """What may change while a job is PENDING (``services.job_update``)."""

    gpus = _bounded("gpus", label="GPUs")
    gpu_memory_mb = _bounded("gpu_memory_mb", label="GPU memory (MB)", required=False)
    cpus = _bounded("cpus", label="CPUs")
    memory_mb = _bounded("memory_mb", label="Memory (MB)", required=False)
    time_limit = forms.CharField(required=False, max_length=40, help_text="Blank: none.")
    priority = _bounded("priority")
    dependencies = forms.CharField(
        required=False, max_length=2000, help_text="e.g. afterok:812; blank: none."
    )

    @classmethod
    def initial_of(cls, job: Any) -> dict[str, Any]:
        return {
            "gpus": job.gpus,
            "gpu_memory_mb": job.gpu_memory_mb,
            "cpus": job.cpus,
            "memory_mb": job.memory_mb,
            "time_limit": job.time_limit_s or "",
            "priority": job.priority,
            "dependencies": jobcontrol.dependencies_text(job.dependencies or []),
        }

    def clean_time_limit(self) -> int | None:
        from scheduler.durations import DurationError, parse_duration

        text = (self.cleaned_data.get("time_limit") or "").strip()
        if not text:
            return None
        try:
            return parse_duration(text)
        except DurationError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_dependencies(self) -> list[dict[str, Any]]:
        try:
            return jobcontrol.parse_dependencies(self.cleaned_data.get("dependencies") or "")
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def changes(self) -> dict[str, Any]:
        cd = dict(self.cleaned_data)
        cd["time_limit_s"] = cd.pop("time_limit")
        return cd


class JobFilterForm(forms.Form):
    """The jobs list's filters (GET)."""

    state = forms.ChoiceField(
        choices=[("", "All"), *[(s.value, s.value.title()) for s in JobState]], required=False
    )
    q = forms.CharField(required=False, max_length=200, label="Search")


class ProfileFilterForm(forms.Form):
    kind = forms.ChoiceField(choices=[("", "All kinds"), *JOB_KINDS], required=False)
    status = forms.ChoiceField(
        choices=[("", "All statuses"), *ApplicationProfile.Status.choices], required=False
    )
    q = forms.CharField(required=False, max_length=200, label="Search")


class NodeTokenCreateForm(forms.Form):
    node_name = forms.CharField(
        label="Node name",
        max_length=100,
        widget=forms.TextInput(attrs={"placeholder": "e.g. gpu-node-1"}),
        help_text="the --name its agent will run with; the token is valid for that node only",
    )

    def clean_node_name(self) -> str:
        name = self.cleaned_data["node_name"].strip()
        if not name or any(c.isspace() or c in "/\x00" for c in name):
            raise forms.ValidationError("a node name has no spaces, slashes or NUL characters")
        return name


class TokenCreateForm(forms.Form):
    name = forms.CharField(
        max_length=100,
        widget=forms.TextInput(attrs={"placeholder": "e.g. gitlab-ci, laptop"}),
    )
