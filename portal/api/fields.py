"""Field types and helpers the REST API's serializers share: unknown fields rejected by name,
bounded integers, bounded JSON objects, and the job fields with their own syntax (a profile
reference, a time limit, dependencies, an array, an output path)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.core import jobcontrol, validation
from portal.core.models import ApplicationProfile


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
