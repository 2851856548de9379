"""Request and response shapes of the REST API. Type checks only: business rules are in
``portal.core.services`` (called from here so type and rule errors come back together).

The job serializers live here; the shared field types in ``portal.api.fields``, the profile
ones in ``portal.api.profile_serializers``, the cluster ones in
``portal.api.cluster_serializers``. Every name stays importable from this module."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.api.cluster_serializers import (
    GpuSerializer,
    MeSerializer,
    NodeDownResultSerializer,
    NodeOperationSerializer,
    NodeSerializer,
)
from portal.api.fields import (
    ArrayField,
    DependenciesField,
    JsonObjectField,
    OutputPathField,
    ProfileRefField,
    RejectUnknownFieldsMixin,
    TimeLimitField,
    _bounded_int,
)
from portal.api.profile_serializers import (
    GpuTimesField,
    ImportErrorSerializer,
    ImportResultSerializer,
    MemoryStepSerializer,
    ProfileImportSerializer,
    ProfileSerializer,
    RawTextField,
    RowErrorSerializer,
)
from portal.core import selectors, services, validation
from portal.core.models import JOB_KINDS, ElasticChange, Job, JobEvent

__all__ = [
    "ArrayField",
    "AttemptPartSerializer",
    "AttemptSerializer",
    "BulkJobRefSerializer",
    "BulkSubmitResultSerializer",
    "BulkSubmitSerializer",
    "CancelConflictSerializer",
    "DependenciesField",
    "ElasticChangeSerializer",
    "ErrorSerializer",
    "GpuSerializer",
    "GpuTimesField",
    "ImportErrorSerializer",
    "ImportResultSerializer",
    "JobDetailSerializer",
    "JobEventSerializer",
    "JobSerializer",
    "JobUpdateSerializer",
    "JsonObjectField",
    "MeSerializer",
    "MemoryStepSerializer",
    "NodeDownResultSerializer",
    "NodeOperationSerializer",
    "NodeSerializer",
    "OutputPathField",
    "PlacementSerializer",
    "PreemptSerializer",
    "ProfileImportSerializer",
    "ProfileRefField",
    "ProfileSerializer",
    "RawTextField",
    "RejectUnknownFieldsMixin",
    "RowErrorSerializer",
    "TimeLimitField",
]


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
