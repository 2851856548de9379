"""Request and response shapes of the REST API. Type checks only: business rules are in
``portal.core.services`` (called from here so type and rule errors come back together)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.core import jobcontrol, selectors, services, validation
from portal.core.adapters import derived_classes
from portal.core.importers import FORMATS, ProfileImportError, validate_profile_mapping
from portal.core.models import (
    JOB_KINDS,
    ApplicationProfile,
    ElasticChange,
    Gpu,
    Job,
    JobEvent,
    Node,
)


class RejectUnknownFieldsMixin:
    """A typo in a CI job file (``gpu``, ``comand``) is a 400 naming the field, not silently
    ignored. Read-only response fields sent back in a request are rejected the same way."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            writable = {name for name, f in self.fields.items() if not f.read_only}
            unknown = sorted(set(data) - writable)
            if unknown:
                allowed = ", ".join(sorted(writable))
                self._unknown_errors = {
                    name: [f"unknown field; the writable fields are: {allowed}"] for name in unknown
                }
            else:
                self._unknown_errors = {}
        return super().to_internal_value(data)


def _bounded_int(name: str, **kwargs: Any) -> serializers.IntegerField:
    """An integer field within ``validation.LIMITS[name]`` (the range in the schema, too)."""
    low, high = validation.LIMITS[name]
    return serializers.IntegerField(min_value=low, max_value=high, **kwargs)


class JsonObjectField(serializers.DictField):
    """A JSON object bounded in depth and size, with clean text and finite numbers only."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        value = super().to_internal_value(data)
        problem = validation.json_error(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value


@extend_schema_field(
    {
        "oneOf": [{"type": "integer"}, {"type": "string"}],
        "nullable": True,
        "description": "profile id, name, or name:version",
    }
)
class ProfileRefField(serializers.Field):
    """An approved profile by id (``7``, ``"7"``), name (``"LAMMPS"``, when one version is
    approved) or ``"name:version"``; represented by its id."""

    def to_representation(self, value: Any) -> int | None:
        return None if value is None else value.pk

    def get_attribute(self, instance: Any) -> Any:
        return instance.profile

    def to_internal_value(self, data: Any) -> ApplicationProfile:
        if isinstance(data, bool) or not isinstance(data, int | str):
            raise serializers.ValidationError("give a profile id or name")
        text = str(data).strip()
        if isinstance(data, int) or text.isdigit():
            if not 0 < int(text) <= validation.DB_INT_MAX:
                raise serializers.ValidationError(f"no profile has id {text}")
            profile = ApplicationProfile.objects.filter(pk=int(text)).first()
            if profile is None:
                raise serializers.ValidationError(f"no profile has id {text}")
            return profile
        problem = validation.text_error(text)
        if problem or not text or len(text) > 200:
            raise serializers.ValidationError(problem or "give a profile id or name")
        name, _, version = text.partition(":")
        rows = ApplicationProfile.objects.filter(name__iexact=name.strip())
        if version:
            rows = rows.filter(version=version.strip())
        approved = [p for p in rows if p.status == ApplicationProfile.Status.APPROVED]
        if len(approved) == 1:
            return approved[0]
        if len(approved) > 1:
            versions = ", ".join(f"{p.name}:{p.version} (id {p.pk})" for p in approved)
            raise serializers.ValidationError(
                f"several approved versions: {versions}; give the id or name:version"
            )
        if rows:
            return rows[0]  # not approved: the business rules say so, naming its status
        raise serializers.ValidationError(f"no profile is named {text!r}")


@extend_schema_field(
    {
        "oneOf": [{"type": "integer"}, {"type": "string"}],
        "nullable": True,
        "description": (
            "time limit per attempt: seconds (7200), a number with a unit (90s, 30m, 2h, 1d) or "
            "[D-]HH:MM:SS (1-00:00:00); read back in seconds. Past it the job is stopped "
            "(SIGTERM, then SIGKILL after the grace) and ends FAILED, reason 'time limit'. "
            "Blank: the profile's default time limit, if any"
        ),
    }
)
class TimeLimitField(serializers.Field):
    """A duration in any form of ``scheduler.durations``; represented in seconds."""

    def to_representation(self, value: Any) -> int | None:
        return None if value is None else int(value)

    def to_internal_value(self, data: Any) -> int:
        from scheduler.durations import DurationError, parse_duration

        try:
            return parse_duration(data)
        except DurationError as exc:
            raise serializers.ValidationError(str(exc)) from None


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string"},
            {
                "type": "array",
                "items": {
                    "oneOf": [
                        {"type": "string"},
                        {
                            "type": "object",
                            "properties": {
                                "type": {
                                    "type": "string",
                                    "enum": list(jobcontrol.DEPENDENCY_TYPES),
                                },
                                "job": {"type": "integer"},
                            },
                        },
                    ]
                },
            },
        ],
        "description": (
            'jobs of yours this one waits for: Slurm\'s form ("afterok:812:813,after:900"; a '
            'bare id is afterany) or a list of {"type", "job"}; read back as that list. after: '
            "once the job started; afterok: completed; afternotok: failed or cancelled; "
            "afterany: ended. A dependency that can never be met cancels this job"
        ),
    }
)
class DependenciesField(serializers.Field):
    def to_representation(self, value: Any) -> list[dict[str, Any]]:
        return list(value or [])

    def to_internal_value(self, data: Any) -> list[dict[str, Any]]:
        try:
            return jobcontrol.parse_dependencies(data)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


@extend_schema_field(
    {
        "type": "string",
        "description": (
            'submit an array: task indices like "0-99", "1,3,5-7" or "0-15:4", optionally with '
            '"%8" (at most 8 tasks placed at once); each task is a job with '
            "COSCHED_ARRAY_TASK_ID set, the answer is the first task (array_job_id = its id)"
        ),
    }
)
class ArrayField(serializers.Field):
    def to_representation(self, value: Any) -> Any:  # write only
        return None

    def to_internal_value(self, data: Any) -> jobcontrol.ArraySpec:
        if not isinstance(data, str):
            raise serializers.ValidationError('give a string like "0-99%8"')
        try:
            return jobcontrol.parse_array(data)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


class OutputPathField(serializers.CharField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(required=False, allow_blank=True, max_length=1000, **kwargs)

    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        problems = jobcontrol.output_path_errors(value)
        if problems:
            raise serializers.ValidationError(problems)
        return value


class PlacementSerializer(serializers.Serializer):
    node = serializers.CharField(source="node.name")
    gpus = serializers.SerializerMethodField(help_text="GPU indices on the node")
    sharing_mode = serializers.CharField()
    mps_percentage = serializers.IntegerField(allow_null=True)
    mig_profile = serializers.CharField()
    policy = serializers.CharField()
    explanation = serializers.CharField()
    active = serializers.BooleanField(help_text="false: a past placement (the job has left it)")
    placed_at = serializers.DateTimeField(source="created_at")
    released_at = serializers.DateTimeField(allow_null=True)

    def get_gpus(self, placement: Any) -> list[int]:
        return sorted(g.index for g in placement.gpus.all())


class AttemptPartSerializer(serializers.Serializer):
    node = serializers.CharField(source="node.name")
    node_rank = serializers.IntegerField()
    gpus = serializers.ListField(child=serializers.IntegerField(), source="gpu_indices")
    started_at = serializers.DateTimeField(allow_null=True)
    run_state = serializers.CharField(help_text="as the node's agent last reported it")
    outcome = serializers.CharField(
        help_text="how the agent says it ended: exited, killed, stopped, lease_expired, "
        "launch_failed, lost; empty while it runs"
    )
    exit_code = serializers.IntegerField(allow_null=True)
    detail = serializers.CharField()


class AttemptSerializer(serializers.Serializer):
    """One start of the job (docs/reliability.md): where, when, and how it ended."""

    attempt = serializers.IntegerField()
    active = serializers.BooleanField()
    nodes = serializers.SerializerMethodField(help_text="node names, node rank order")
    gpus = serializers.SerializerMethodField(
        help_text='GPUs of every node, "node/index", node rank order (empty: CPU)'
    )
    placed_at = serializers.DateTimeField(source="created_at")
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(source="released_at", allow_null=True)
    outcome = serializers.CharField(
        help_text="completed, failed, cancelled, requeued, preempted or regrouped (an elastic "
        "job's group changed); empty while it is current"
    )
    end_reason = serializers.CharField(
        help_text="why it ended; for a preempted attempt, the policy's explanation or who asked"
    )
    exit_code = serializers.SerializerMethodField()
    parts = serializers.SerializerMethodField()

    def _parts(self, placement: Any) -> list[Any]:
        return sorted(placement.parts.all(), key=lambda p: p.node_rank)

    def get_nodes(self, placement: Any) -> list[str]:
        return [p.node.name for p in self._parts(placement)]

    def get_gpus(self, placement: Any) -> list[str]:
        return [f"{p.node.name}/{i}" for p in self._parts(placement) for i in p.gpu_indices or ()]

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_exit_code(self, placement: Any) -> int | None:
        """The exit status that decided: the first rank that failed, else rank 0's."""
        parts = self._parts(placement)
        for part in parts:
            if part.exit_code not in (None, 0):
                return part.exit_code
        return parts[0].exit_code if parts else None

    @extend_schema_field(AttemptPartSerializer(many=True))
    def get_parts(self, placement: Any) -> list[Any]:
        return AttemptPartSerializer(self._parts(placement), many=True).data


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["at", "from_state", "to_state", "actor", "message"]


class JobSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    """The job contract CI pipelines rely on (extend it, never rename a field)."""

    profile = ProfileRefField(
        required=False,
        allow_null=True,
        help_text=(
            "an approved application profile: its id, its name (when one version is approved) "
            'or "name:version"'
        ),
    )
    gpus = _bounded_int("gpus", required=False, help_text="0 = CPU-only job")
    gpu_memory_mb = _bounded_int(
        "gpu_memory_mb", required=False, allow_null=True, help_text="per GPU"
    )
    cpus = _bounded_int("cpus", required=False, help_text="cores (per node for a multi-node job)")
    memory_mb = _bounded_int(
        "memory_mb",
        required=False,
        allow_null=True,
        help_text="host memory (MB): at most the largest node's; reserved on the node and "
        "enforced by the runner",
    )
    sharing = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=40,
        help_text="whether the job's GPUs may be shared: never (GPUs of its own), allowed, mps, "
        "time_slicing or a MIG profile name (1g.6gb); empty: the site default "
        "(docs/jobs.md)",
    )
    device = serializers.ChoiceField(
        choices=["gpu", "auto", "cpu"],
        required=False,
        allow_blank=True,
        help_text="gpu: GPUs only; auto: a one-GPU job the policy may run on a CPU node; cpu: a "
        "CPU-only job (gpus 0); empty: gpu for a GPU job, cpu for a CPU one",
    )
    kind = serializers.ChoiceField(choices=JOB_KINDS, required=False)
    params = JsonObjectField(
        required=False,
        help_text=(
            f"free-form job parameters (a JSON object, at most {validation.JSON_MAX_DEPTH} levels "
            f"deep and {validation.JSON_MAX_BYTES // 1024} KiB)"
        ),
    )
    priority = _bounded_int("priority", required=False, help_text="higher runs first")
    command = serializers.CharField(
        required=True,
        allow_blank=True,
        trim_whitespace=False,
        help_text=(
            "required; blank only with a container_image (its entry point runs). "
            f"Run by /bin/sh -c on the node; at most {validation.COMMAND_MAX_BYTES:,} bytes "
            "(Linux's MAX_ARG_STRLEN)"
        ),
    )
    container_image = serializers.CharField(required=False, allow_blank=True, max_length=300)
    elastic_min_workers = _bounded_int("elastic_min_workers", required=False, allow_null=True)
    elastic_max_workers = _bounded_int("elastic_max_workers", required=False, allow_null=True)
    elastic_deadline_s = _bounded_int(
        "elastic_deadline_s",
        required=False,
        allow_null=True,
        help_text="elastic jobs: seconds after the start the job should finish by",
    )
    elastic_value_per_hour = serializers.FloatField(
        required=False,
        allow_null=True,
        min_value=validation.FLOAT_LIMITS["elastic_value_per_hour"][0],
        max_value=validation.FLOAT_LIMITS["elastic_value_per_hour"][1],
        help_text="elastic jobs: GPU-hours one hour sooner is worth (not with a deadline)",
    )
    max_global_batch = _bounded_int(
        "max_global_batch",
        required=False,
        allow_null=True,
        help_text="elastic jobs: the largest global batch (local batch x workers)",
    )
    time_limit = TimeLimitField(source="time_limit_s", required=False, allow_null=True)
    end_label = serializers.CharField(
        read_only=True,
        help_text='why beside a final state: "time limit" for a job stopped at its time limit; '
        "else empty",
    )
    dependencies = DependenciesField(required=False)
    held = serializers.BooleanField(
        required=False, help_text="submit held: it does not start until released"
    )
    array = ArrayField(required=False, write_only=True)
    array_job_id = serializers.IntegerField(
        source="array_of_id", read_only=True, allow_null=True, help_text="the array's first task"
    )
    array_index = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="COSCHED_ARRAY_TASK_ID of an array task"
    )
    array_limit = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="most tasks of the array placed at once"
    )
    user_paused = serializers.BooleanField(
        read_only=True, help_text="paused by a person: stays PAUSED until a person resumes it"
    )
    output = OutputPathField(
        source="output_path",
        help_text=(
            "where the job's output goes on the node: %j job id, %a array index, %u user, "
            "%% a percent sign; relative to the work directory; empty: cosched-%j.out there"
        ),
    )
    error = OutputPathField(
        source="error_path", help_text="where standard error goes (same patterns); empty: output"
    )
    owner = serializers.CharField(source="owner.get_username", read_only=True)
    project = serializers.CharField(
        required=False,
        allow_blank=True,
        allow_null=True,
        max_length=100,
        help_text=(
            "the project (team) the job belongs to: one you are a member of; empty: your "
            "default project (docs/projects.md)"
        ),
    )
    profile_name = serializers.CharField(
        source="profile.name", read_only=True, allow_null=True, default=None
    )
    waiting_reason = serializers.SerializerMethodField(
        help_text=(
            "PENDING jobs: why the scheduler left the job queued in its last cycle (empty until "
            "its first cycle); null in other states"
        )
    )
    placement = serializers.SerializerMethodField(
        help_text="where the job runs; once it has finished, where it ran last (null: never placed)"
    )
    attempts = serializers.SerializerMethodField(
        help_text="every start of the job, first first: where, when, and how it ended"
    )
    elapsed_s = serializers.SerializerMethodField(
        help_text="seconds from its last start to its end (or now); null: never started"
    )
    queue_wait_s = serializers.SerializerMethodField(
        help_text="seconds from submission to its first start (or now, while it never started)"
    )
    gpu_hours = serializers.SerializerMethodField(help_text="GPUs x hours over every attempt")
    nodes = serializers.SerializerMethodField(
        help_text="the nodes of its last attempt, node rank 0 first"
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "command",
            "container_image",
            "profile",
            "gpus",
            "gpu_memory_mb",
            "cpus",
            "memory_mb",
            "sharing",
            "device",
            "kind",
            "params",
            "priority",
            "elastic_min_workers",
            "elastic_max_workers",
            "elastic_deadline_s",
            "elastic_value_per_hour",
            "max_global_batch",
            "time_limit",
            "dependencies",
            "held",
            "array",
            "array_job_id",
            "array_index",
            "array_limit",
            "user_paused",
            "output",
            "error",
            "state",
            "owner",
            "project",
            "submitted_at",
            "scheduled_at",
            "started_at",
            "finished_at",
            "exit_code",
            "failure_reason",
            "requeue_count",
            "end_label",
            "waiting_reason",
            "profile_name",
            "placement",
            "attempts",
            "elapsed_s",
            "queue_wait_s",
            "gpu_hours",
            "nodes",
        ]
        read_only_fields = [
            "id",
            "state",
            "submitted_at",
            "scheduled_at",
            "started_at",
            "finished_at",
            "exit_code",
            "failure_reason",
            "requeue_count",
        ]

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_waiting_reason(self, job: Job) -> str | None:
        return job.waiting_reason if job.state == "PENDING" else None

    @extend_schema_field(PlacementSerializer(allow_null=True))
    def get_placement(self, job: Job) -> dict[str, Any] | None:
        placement = selectors.job_placement(job)
        return None if placement is None else PlacementSerializer(placement).data

    @extend_schema_field(AttemptSerializer(many=True))
    def get_attempts(self, job: Job) -> list[Any]:
        return AttemptSerializer(selectors.job_attempts(job), many=True).data

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_elapsed_s(self, job: Job) -> float | None:
        return selectors.job_history(job)["elapsed_s"]

    @extend_schema_field(serializers.FloatField())
    def get_queue_wait_s(self, job: Job) -> float:
        return selectors.job_history(job)["queue_wait_s"]

    @extend_schema_field(serializers.FloatField())
    def get_gpu_hours(self, job: Job) -> float:
        return selectors.job_history(job)["gpu_hours"]

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_nodes(self, job: Job) -> list[str]:
        return selectors.job_history(job)["nodes"]

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        """Report type errors, unknown fields and business-rule errors in one 400."""
        try:
            values = super().to_internal_value(data)
            errors: dict[str, Any] = {}
        except serializers.ValidationError as exc:
            if not isinstance(exc.detail, dict):
                raise
            errors = dict(exc.detail)
            values = self._valid_subset(data, set(errors))
        errors.update(getattr(self, "_unknown_errors", {}))
        for name, messages in services.job_rule_errors(values, skip=set(errors)).items():
            errors.setdefault(name, []).extend(messages)
        request = self.context.get("request")
        if request is not None and "project" not in errors:
            try:
                services.submission_project(request.user, values.get("project"))
            except DjangoValidationError as exc:
                errors["project"] = exc.message_dict["project"]
        if errors:
            raise serializers.ValidationError(errors)
        return values

    def _valid_subset(self, data: Any, failed: set[str]) -> dict[str, Any]:
        """The values of the fields that passed their type check (for the rule checks)."""
        values: dict[str, Any] = {}
        if not isinstance(data, dict):
            return values
        for field in self._writable_fields:
            if field.field_name in failed or field.field_name not in data:
                continue
            try:
                values[field.source] = field.run_validation(data[field.field_name])
            except serializers.ValidationError:
                failed.add(field.field_name)
        return values


class JobUpdateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    """What PATCH /api/v1/jobs/<id>/ may change while the job is PENDING."""

    gpus = _bounded_int("gpus", required=False)
    gpu_memory_mb = _bounded_int("gpu_memory_mb", required=False, allow_null=True)
    cpus = _bounded_int("cpus", required=False)
    memory_mb = _bounded_int("memory_mb", required=False, allow_null=True)
    time_limit = TimeLimitField(source="time_limit_s", required=False, allow_null=True)
    priority = _bounded_int("priority", required=False)
    dependencies = DependenciesField(required=False)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise serializers.ValidationError({"detail": ["give a JSON object"]})
        try:
            values = super().to_internal_value(data)
            errors: dict[str, Any] = {}
        except serializers.ValidationError as exc:
            errors, values = dict(exc.detail), {}
        errors.update(getattr(self, "_unknown_errors", {}))
        if errors:
            raise serializers.ValidationError(errors)
        if not values:
            raise serializers.ValidationError(
                {"detail": ["nothing to change: give " + ", ".join(self.fields)]}
            )
        return values


class ElasticChangeSerializer(serializers.ModelSerializer):
    """One worker-count change or straggler replacement of an elastic job (issue 17)."""

    summary = serializers.CharField(
        read_only=True, help_text='"2 -> 4 workers (S=0.84)" or "replace rank(s) 3"'
    )

    class Meta:
        model = ElasticChange
        fields = [
            "at",
            "summary",
            "kind",
            "workers_from",
            "workers_to",
            "ranks",
            "efficiency",
            "local_batch",
            "reason",
            "policy",
            "applied",
            "attempt",
            "gpus",
            "refused",
        ]
        read_only_fields = fields


class JobDetailSerializer(JobSerializer):
    events = serializers.SerializerMethodField(help_text="the job's timeline, oldest first")
    elastic_changes = serializers.SerializerMethodField(
        help_text="elastic jobs: each worker-count change and replacement, with its reason and S"
    )
    placements = serializers.SerializerMethodField(
        help_text="every placement (attempt) of the job, newest first; the active one first"
    )

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "placements", "events", "elastic_changes"]

    @extend_schema_field(ElasticChangeSerializer(many=True))
    def get_elastic_changes(self, job: Job) -> list[dict[str, Any]]:
        return ElasticChangeSerializer(job.elastic_changes.all(), many=True).data

    @extend_schema_field(PlacementSerializer(many=True))
    def get_placements(self, job: Job) -> list[dict[str, Any]]:
        rows = getattr(job, "placements_newest_first", None)
        if rows is None:
            rows = (
                job.placements.select_related("node")
                .prefetch_related("gpus")
                .order_by("-active", "-id")
            )
        return PlacementSerializer(rows, many=True).data

    @extend_schema_field(JobEventSerializer(many=True))
    def get_events(self, job: Job) -> list[dict[str, Any]]:
        return JobEventSerializer(selectors.job_events(job), many=True).data


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()


class PreemptSerializer(serializers.Serializer):
    reason = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=500,
        help_text="why (shown on the job page's attempts); default: who preempted it",
    )

    def validate_reason(self, value: str) -> str:
        problem = validation.text_error(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value.strip()


class CancelConflictSerializer(serializers.Serializer):
    detail = serializers.CharField()
    state = serializers.CharField()


class MemoryStepSerializer(serializers.Serializer):
    start_fraction = serializers.FloatField(min_value=0, max_value=1, required=False)
    from_mb = serializers.FloatField(min_value=0)
    to_mb = serializers.FloatField(min_value=0)


class GpuTimesField(serializers.DictField):
    """``{"V100": 198.0, ...}`` read from the profile's ``gpu_times`` rows."""

    def get_attribute(self, instance: ApplicationProfile) -> dict[str, float]:
        return {t.gpu_model: t.time_s for t in instance.gpu_times.all()}


class ProfileSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    """An application profile (docs: Application profiles), in the same schema as the JSON import
    (docs/profiles.md). ``gpu_time_s`` maps a GPU catalogue model to solo run seconds."""

    gpu_time_s = GpuTimesField(
        child=serializers.FloatField(min_value=0), required=False, help_text="{model: seconds}"
    )
    memory_steps = MemoryStepSerializer(many=True, required=False)
    classes = serializers.SerializerMethodField(
        help_text="derived classes (scheduler.classes): kernel class, C/M class, scale class"
    )
    approved_by = serializers.CharField(
        source="approved_by.get_username", read_only=True, default=None, allow_null=True
    )

    class Meta:
        model = ApplicationProfile
        exclude = ["created_by"]
        read_only_fields = ["status", "source", "approved_at", "created_at", "updated_at"]
        validators: list = []  # name+version uniqueness: services.profile_save names the field

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_classes(self, profile: ApplicationProfile) -> dict[str, str | None]:
        return derived_classes(profile)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Check with the import rules too (GPU model names, step order, percentages)."""
        if getattr(self, "_unknown_errors", None):
            raise serializers.ValidationError(self._unknown_errors)
        raw = dict(self.initial_data)
        if self.instance is not None:
            raw.setdefault("name", self.instance.name)
            raw.setdefault("version", self.instance.version)
        try:
            self.record = validate_profile_mapping(raw)
        except ProfileImportError as exc:
            errors: dict[str, list[str]] = {}
            for error in exc.errors:
                errors.setdefault(error.field, []).append(error.message)
            raise serializers.ValidationError(errors) from None
        return attrs

    def create(self, validated_data: dict[str, Any]) -> ApplicationProfile:
        return _as_validation_error(
            services.profile_save, self.record, actor=self.context["request"].user
        )

    def update(self, instance: ApplicationProfile, validated_data: dict[str, Any]) -> Any:
        return _as_validation_error(
            services.profile_save,
            self.record,
            actor=self.context["request"].user,
            profile=instance,
        )


def _as_validation_error(func: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return func(*args, **kwargs)
    except DjangoValidationError as exc:
        raise serializers.ValidationError(exc.message_dict) from None


class RawTextField(serializers.CharField):
    """Text passed on as it is (a file's content): the importer, not this field, reports NUL
    characters and other binary data, row by row in the import's error shape."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validators = [v for v in self.validators if "Prohibit" not in type(v).__name__]


class ProfileImportSerializer(serializers.Serializer):
    """``POST /api/v1/profiles/import/``: a multipart ``file``, or ``content`` as text."""

    file = serializers.FileField(required=False)
    content = RawTextField(
        required=False, trim_whitespace=False, help_text="the file's text (instead of file)"
    )
    profiles = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        help_text="JSON body: the profiles in our JSON schema (instead of file/content)",
    )
    format = serializers.ChoiceField(choices=FORMATS, required=False)
    status = serializers.ChoiceField(
        choices=ApplicationProfile.Status.choices, default=ApplicationProfile.Status.DRAFT
    )
    source = serializers.ChoiceField(
        choices=ApplicationProfile.Source.choices, default=ApplicationProfile.Source.IMPORTED
    )
    update_existing = serializers.BooleanField(default=False)
    name = serializers.CharField(required=False, help_text="profile name (nvprof / ncu files)")
    version = serializers.CharField(required=False)
    kind = serializers.ChoiceField(choices=JOB_KINDS, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        given = [k for k in ("file", "content", "profiles") if attrs.get(k) is not None]
        if len(given) != 1:
            raise serializers.ValidationError(
                {"file": ["give exactly one of file (multipart), content or profiles"]}
            )
        return attrs


class RowErrorSerializer(serializers.Serializer):
    row = serializers.IntegerField(allow_null=True)
    field = serializers.CharField()
    message = serializers.CharField()


class ImportErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()
    errors = RowErrorSerializer(many=True)


class ImportResultSerializer(serializers.Serializer):
    created = serializers.ListField(child=serializers.IntegerField())
    updated = serializers.ListField(child=serializers.IntegerField())
    profiles = ProfileSerializer(many=True)


class GpuSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", read_only=True)

    class Meta:
        model = Gpu
        fields = [
            "id",
            "node",
            "index",
            "uuid",
            "model",
            "architecture",
            "memory_mb",
            "sm_count",
            "sharing_modes",
            "mig_profiles",
            "current_mode",
        ]


class NodeSerializer(serializers.ModelSerializer):
    gpus = GpuSerializer(many=True, read_only=True)
    state = serializers.SerializerMethodField(
        help_text="as sinfo says it: up, draining (jobs still running), drained, down (lost) "
        "or 'down (staff)'"
    )
    state_changed_by = serializers.CharField(
        read_only=True, allow_null=True, help_text="staff only (null for others)"
    )
    isolation = serializers.JSONField(
        read_only=True,
        help_text="staff only (null for others): how the node keeps jobs apart, as its agent "
        'reported: [{"what": "accounts" | "limits" | "gpu_devices", "level": "ok" | "weak" | '
        '"n/a", "text"}]',
    )
    container_runtimes = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text='container runtimes the node runs container jobs with ("podman", '
        '"apptainer"; docs/containers.md); empty: no container jobs there',
    )

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "kind",
            "cores",
            "memory_mb",
            "backend",
            "status",
            "state",
            "state_reason",
            "state_changed_by",
            "state_changed_at",
            "agent_version",
            "last_heartbeat",
            "gpus",
            "container_runtimes",
            "isolation",
        ]

    def get_state(self, instance: Node) -> str:
        from portal.core.node_ops import node_state_label

        return node_state_label(instance)

    def to_representation(self, instance: Node) -> dict[str, Any]:
        data = super().to_representation(instance)
        request = self.context.get("request")
        if request is None or not request.user.is_staff:
            data["isolation"] = None  # accounts, paths: the operators' business
            data["state_changed_by"] = None
        return data


class NodeOperationSerializer(serializers.Serializer):
    """A drain or down: why (required for both; ignored by resume)."""

    reason = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=500,
        help_text="why the node is drained or taken down (shown on the cluster page)",
    )


class NodeDownResultSerializer(serializers.Serializer):
    node = NodeSerializer()
    requeued = serializers.ListField(
        child=serializers.IntegerField(), help_text="jobs preempted back to the queue"
    )


class MeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()
    email = serializers.CharField()
    is_staff = serializers.BooleanField()
    auth = serializers.CharField(help_text="how this request authenticated: token or session")


class BulkSubmitSerializer(serializers.Serializer):
    """``POST /api/v1/jobs/bulk/``: many jobs in one request, all or nothing."""

    jobs = serializers.ListField(
        child=serializers.DictField(),
        min_length=1,
        max_length=1000,
        help_text="each a job as POST /api/v1/jobs/ takes it; at most 1000",
    )


class BulkJobRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    state = serializers.CharField()


class BulkSubmitResultSerializer(serializers.Serializer):
    created = serializers.IntegerField(help_text="jobs created (0 on a replayed Idempotency-Key)")
    jobs = BulkJobRefSerializer(many=True, help_text="in the order submitted")
