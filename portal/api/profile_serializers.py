"""Request and response shapes of the REST API's application profiles and their import.
Importable from ``portal.api.serializers`` as well."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.api.fields import RejectUnknownFieldsMixin
from portal.core import services
from portal.core.adapters import derived_classes
from portal.core.importers import FORMATS, ProfileImportError, validate_profile_mapping
from portal.core.models import JOB_KINDS, ApplicationProfile


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
