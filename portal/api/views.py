"""REST API v1 views: thin wrappers over ``portal.core.selectors`` (reads) and
``portal.core.services`` (writes)."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action, api_view
from rest_framework.exceptions import NotFound, ParseError, PermissionDenied, ValidationError
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api.limits import BoundedJSONParser
from portal.api.pagination import StandardPagination
from portal.api.permissions import IsStaffOrReadOnly
from portal.api.serializers import (
    BulkSubmitResultSerializer,
    BulkSubmitSerializer,
    CancelConflictSerializer,
    ErrorSerializer,
    GpuSerializer,
    ImportErrorSerializer,
    ImportResultSerializer,
    JobDetailSerializer,
    JobSerializer,
    JobUpdateSerializer,
    MeSerializer,
    NodeDownResultSerializer,
    NodeOperationSerializer,
    NodeSerializer,
    PreemptSerializer,
    ProfileImportSerializer,
    ProfileSerializer,
)
from portal.core import lookups, node_ops, selectors, services
from portal.core.importers import ProfileImportConflict, ProfileImportError
from portal.core.models import JOB_KINDS, ApplicationProfile, Job
from portal.core.states import IllegalTransition, JobState
from portal.teams.selectors import can_control_job

IDEMPOTENCY_HEADER = "Idempotency-Key"
# Actions that change a job: its owner, its project's managers and staff only.
CONTROL_ACTIONS = (
    "cancel",
    "pause",
    "resume",
    "hold",
    "release",
    "requeue",
    "partial_update",
)
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 200


def _query_errors(exc: DjangoValidationError) -> ValidationError:
    return ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)


_STATE = f"({'|'.join(s.value for s in JobState)})"
#: What the ``state`` filter takes: known states, comma-separated (any case is read too).
STATE_LIST_PATTERN = f"^{_STATE}(,{_STATE})*$"

idempotency_parameter = OpenApiParameter(
    name=IDEMPOTENCY_HEADER,
    type=str,
    location=OpenApiParameter.HEADER,
    required=False,
    description=(
        "Makes the submission safe to retry: a retry with the same key and the same body "
        "returns the job the first request created (200, header `Idempotent-Replayed: true`) "
        "instead of creating a second one; the same key with a different body is a 422. "
        f"Keys are per user, at most {MAX_KEY_LENGTH} characters."
    ),
)


#: The longest ``finished_since`` window the history answers (the API's 400 names it).
HISTORY_MAX_DAYS = 3660


def history_window(params: Any) -> dict[str, Any]:
    """``finished_since`` / ``finished_until`` of a job list request as datetimes (7d, 24h,
    30m, 2w, an ISO date or date-time); a 400 naming the parameter when one is not a time or
    reaches back more than ``HISTORY_MAX_DAYS``."""
    from datetime import timedelta

    from django.utils import timezone

    from portal.teams.accounting import parse_when

    now = timezone.now()
    out: dict[str, Any] = {}
    errors: dict[str, list[str]] = {}
    for name in ("finished_since", "finished_until"):
        text = params.get(name)
        if not text:
            continue
        try:
            moment = parse_when(text, now)
        except (ValueError, OverflowError) as exc:
            errors[name] = [
                f"more than {HISTORY_MAX_DAYS} days back"
                if isinstance(exc, OverflowError)
                else str(exc)
            ]
            continue
        if moment is not None and now - moment > timedelta(days=HISTORY_MAX_DAYS):
            errors[name] = [f"more than {HISTORY_MAX_DAYS} days back"]
            continue
        out[name] = moment
    since, until = out.get("finished_since"), out.get("finished_until")
    if since is not None and until is not None and until <= since:
        errors["finished_until"] = ["must be after finished_since"]
    if errors:
        raise ValidationError(errors)
    return out


@extend_schema_view(
    list=extend_schema(
        summary="List jobs (your own; staff: all)",
        parameters=[
            OpenApiParameter(
                "state",
                {"type": "string", "pattern": STATE_LIST_PATTERN},
                description="state(s), comma-separated, e.g. PENDING,RUNNING",
            ),
            OpenApiParameter("kind", str, enum=[k for k, _ in JOB_KINDS]),
            OpenApiParameter("search", str, description="substring of the job name"),
            OpenApiParameter("array", int, description="the tasks of this array (its first id)"),
            OpenApiParameter(
                "finished_since",
                str,
                description="history (like sacct): jobs that finished since then (7d, 24h, 30m, "
                f"2w or an ISO date; at most {HISTORY_MAX_DAYS} days back), latest first",
            ),
            OpenApiParameter("finished_until", str, description="... and before then"),
            OpenApiParameter("user", str, description="the owner's username"),
            OpenApiParameter("project", str, description="the project's name"),
        ],
    ),
    retrieve=extend_schema(
        summary="One job with its timeline",
        responses={200: JobDetailSerializer, 404: ErrorSerializer},
    ),
)
class JobViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Jobs. A user sees and cancels only their own jobs (another user's job is a 404)."""

    serializer_class = JobSerializer
    pagination_class = StandardPagination

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):  # schema generation
            return Job.objects.none()
        params = self.request.query_params
        window = history_window(params)
        try:
            qs = selectors.jobs_visible_to(
                self.request.user,
                state=params.getlist("state") or None,
                kind=params.get("kind"),
                search=params.get("search") or params.get("name"),
                owner=params.get("user"),
                project=params.get("project"),
                **window,
            )
        except DjangoValidationError as exc:
            raise _query_errors(exc) from None
        array = params.get("array")
        if array is not None and self.action == "list":
            if not array.isdigit() or int(array) > 2**62:
                raise ValidationError({"array": ["give the id of an array's first task"]})
            qs = qs.filter(array_of_id=int(array)).order_by("array_index", "id")
        return qs

    def get_serializer_class(self) -> Any:
        return JobDetailSerializer if self.action == "retrieve" else JobSerializer

    def get_object(self) -> Any:
        job = selectors.job_for_user(self.request.user, self.kwargs["pk"])
        if self.action in CONTROL_ACTIONS and not can_control_job(self.request.user, job):
            raise PermissionDenied(
                f"job {job.pk} belongs to {job.owner.get_username()} in project "
                f"{job.project}: only its owner, the project's managers and staff may change it"
            )
        return job

    @extend_schema(
        summary="Submit a job",
        parameters=[idempotency_parameter],
        request=JobSerializer,
        responses={
            201: OpenApiResponse(JobSerializer, description="created"),
            200: OpenApiResponse(
                JobSerializer,
                description="a retry with the same Idempotency-Key: the job created first",
            ),
            400: OpenApiResponse(
                OpenApiTypes.OBJECT, description="field -> list of messages, every bad field"
            ),
            422: OpenApiResponse(
                ErrorSerializer,
                description="the Idempotency-Key was used before with a different body",
            ),
        },
        examples=[
            OpenApiExample(
                "GPU training job",
                value={
                    "name": "resnet50-nightly",
                    "command": "python train.py --epochs 3",
                    "gpus": 1,
                    "gpu_memory_mb": 8000,
                    "cpus": 4,
                    "kind": "dl-train",
                    "params": {"batch_size": 64},
                    "priority": 0,
                },
                request_only=True,
            )
        ],
    )
    def create(self, request: Request) -> Response:
        key = request.headers.get(IDEMPOTENCY_HEADER) or None
        if key is not None and len(key) > MAX_KEY_LENGTH:
            raise ValidationError({IDEMPOTENCY_HEADER: [f"at most {MAX_KEY_LENGTH} characters"]})
        serializer = JobSerializer(data=request.data, context=self.get_serializer_context())
        try:
            # The serializer's rule checks and job_submit's read the cluster and the project
            # once between them.
            with lookups.submission_lookups():
                serializer.is_valid(raise_exception=True)
                job, created = services.job_submit(
                    request.user, idempotency_key=key, **serializer.validated_data
                )
        except DjangoValidationError as exc:
            raise _query_errors(exc) from None
        except services.IdempotencyConflict as exc:
            return Response(
                {
                    "detail": (
                        f"{IDEMPOTENCY_HEADER} {key!r} was already used for job {exc.job.pk} "
                        "with a different request body; use a new key for a new job"
                    ),
                    "job": exc.job.pk,
                },
                status=status.HTTP_422_UNPROCESSABLE_ENTITY,
            )
        if created:
            # The answer is the job as saved, without reading it back: a new job has no
            # placement yet, and its owner, project and profile are the objects in hand.
            job.placements_newest_first = []
            serializer.instance = job
            body = serializer.data
            return Response(
                body,
                status=status.HTTP_201_CREATED,
                headers={"Location": f"/api/v1/jobs/{job.pk}/"},
            )
        job = selectors.job_for_user(request.user, job.pk)
        body = JobSerializer(job, context=self.get_serializer_context()).data
        return Response(body, status=status.HTTP_200_OK, headers={REPLAYED_HEADER: "true"})

    @extend_schema(
        summary="Submit many jobs at once, all or nothing",
        description=(
            'For pipelines that submit hundreds of jobs: `{"jobs": [job, ...]}`, each job as '
            "`POST /api/v1/jobs/` takes it, at most 1000. Every job is checked; if any is "
            "refused nothing is created and the 400 names each bad job by its index: "
            '`{"jobs": {"3": {"gpus": [...]}}}`. With an Idempotency-Key a retry of '
            "the same batch returns the jobs created the first time (200)."
        ),
        parameters=[idempotency_parameter],
        request=BulkSubmitSerializer,
        responses={
            201: BulkSubmitResultSerializer,
            200: OpenApiResponse(
                BulkSubmitResultSerializer, description="a retry with the same Idempotency-Key"
            ),
            400: OpenApiResponse(
                OpenApiTypes.OBJECT, description="jobs -> index -> field -> messages"
            ),
            422: ErrorSerializer,
        },
    )
    @action(detail=False, methods=["post"], url_path="bulk")
    def bulk(self, request: Request) -> Response:
        key = request.headers.get(IDEMPOTENCY_HEADER) or None
        if key is not None and len(key) > MAX_KEY_LENGTH - 5:
            raise ValidationError(
                {IDEMPOTENCY_HEADER: [f"at most {MAX_KEY_LENGTH - 5} characters for a bulk submit"]}
            )
        body = BulkSubmitSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        context = self.get_serializer_context()
        items, errors = [], {}
        try:
            with lookups.submission_lookups():  # the cluster and the projects: read once
                for i, item in enumerate(body.validated_data["jobs"]):
                    one = JobSerializer(data=item, context=context)
                    if one.is_valid():
                        items.append(one.validated_data)
                    else:
                        errors[str(i)] = one.errors
                if errors:
                    raise ValidationError({"jobs": errors})
                jobs, created = services.jobs_submit_bulk(request.user, items, idempotency_key=key)
        except services.BulkSubmitError as exc:
            raise ValidationError({"jobs": {str(i): e for i, e in exc.errors.items()}}) from None
        except services.IdempotencyConflict as exc:
            return Response(
                {
                    "detail": (
                        f"{IDEMPOTENCY_HEADER} {key!r} was already used for another batch "
                        f"(job {exc.job.pk}); use a new key for a new batch"
                    ),
                    "job": exc.job.pk,
                },
                status=status.HTTP_422_UNPROCESSABLE_ENTITY,
            )
        data = {
            "created": len(jobs) if created else 0,
            "jobs": [{"id": j.pk, "name": j.name, "state": j.state} for j in jobs],
        }
        return Response(
            data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
            headers={} if created else {REPLAYED_HEADER: "true"},
        )

    @extend_schema(
        summary="Cancel a job",
        description=(
            "Cancels a job that has not finished (PENDING, SCHEDULED, RUNNING or PAUSED). "
            "A finished job (COMPLETED, FAILED, CANCELLED) is a 409; another user's job a 404."
        ),
        request=None,
        responses={
            200: JobSerializer,
            404: ErrorSerializer,
            409: OpenApiResponse(CancelConflictSerializer, description="the job has finished"),
        },
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        try:
            job = services.job_cancel(job, actor=f"user:{request.user.get_username()}")
        except IllegalTransition as exc:
            return Response(
                {
                    "detail": (
                        f"job {job.pk} is already {exc.current}: only a job that has not "
                        "finished can be cancelled"
                    ),
                    "state": exc.current,
                },
                status=status.HTTP_409_CONFLICT,
            )
        job = selectors.job_for_user(request.user, job.pk)
        return Response(JobSerializer(job, context=self.get_serializer_context()).data)

    def _control(self, request: Request, verb: str) -> Response:
        job = self.get_object()
        actor = f"user:{request.user.get_username()}"
        service = services.job_pause if verb == "pause" else services.job_resume
        try:
            if verb == "pause":
                job = services.job_pause(
                    job, actor=actor, message=f"paused by {actor}", by_user=True
                )
            else:
                job = service(job, actor=actor, message=f"{verb}d by {actor}")
        except IllegalTransition as exc:
            needed = "RUNNING" if verb == "pause" else "PAUSED"
            return Response(
                {
                    "detail": f"job {job.pk} is {exc.current}: only a {needed} job can be {verb}d",
                    "state": exc.current,
                },
                status=status.HTTP_409_CONFLICT,
            )
        job = selectors.job_for_user(request.user, job.pk)
        return Response(JobSerializer(job, context=self.get_serializer_context()).data)

    @extend_schema(
        summary="Pause a running job",
        description=(
            "Stops a RUNNING job's processes (SIGSTOP) on its node; it keeps its placement and "
            "GPU memory. Any other state is a 409; another user's job a 404."
        ),
        request=None,
        responses={
            200: JobSerializer,
            404: ErrorSerializer,
            409: OpenApiResponse(CancelConflictSerializer, description="the job is not RUNNING"),
        },
    )
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str | None = None) -> Response:
        return self._control(request, "pause")

    @extend_schema(
        summary="Resume a paused job",
        description="Continues a PAUSED job (SIGCONT). Any other state is a 409.",
        request=None,
        responses={
            200: JobSerializer,
            404: ErrorSerializer,
            409: OpenApiResponse(CancelConflictSerializer, description="the job is not PAUSED"),
        },
    )
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        return self._control(request, "resume")

    def _conflict(self, job: Any, exc: IllegalTransition, needed: str, verb: str) -> Response:
        return Response(
            {
                "detail": f"job {job.pk} is {exc.current}: only {needed} job can be {verb}",
                "state": exc.current,
            },
            status=status.HTTP_409_CONFLICT,
        )

    def _answer(self, request: Request, job: Any) -> Response:
        job = selectors.job_for_user(request.user, job.pk)
        return Response(JobSerializer(job, context=self.get_serializer_context()).data)

    @extend_schema(
        summary="Hold a pending job",
        description="A held job stays PENDING and is not started until released. "
        "A job that is not PENDING is a 409.",
        request=None,
        responses={200: JobSerializer, 404: ErrorSerializer, 409: CancelConflictSerializer},
    )
    @action(detail=True, methods=["post"])
    def hold(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        try:
            job = services.job_hold(job, actor=f"user:{request.user.get_username()}")
        except IllegalTransition as exc:
            return self._conflict(job, exc, "a PENDING", "held")
        return self._answer(request, job)

    @extend_schema(
        summary="Release a held job",
        description="The job queues again as before. A job that is not held is a 409.",
        request=None,
        responses={200: JobSerializer, 404: ErrorSerializer, 409: CancelConflictSerializer},
    )
    @action(detail=True, methods=["post"])
    def release(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        try:
            job = services.job_release(job, actor=f"user:{request.user.get_username()}")
        except IllegalTransition as exc:
            return self._conflict(job, exc, "a held", "released")
        return self._answer(request, job)

    @extend_schema(
        summary="Requeue a job (its owner)",
        description=(
            "Stops a SCHEDULED, RUNNING or PAUSED job (SIGTERM, then SIGKILL after the grace) "
            "and puts it back in the queue; the attempt ends 'requeued'. Any other state is a "
            "409."
        ),
        request=None,
        responses={200: JobSerializer, 404: ErrorSerializer, 409: CancelConflictSerializer},
    )
    @action(detail=True, methods=["post"])
    def requeue(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        try:
            job = services.job_requeue(job, actor=f"user:{request.user.get_username()}")
        except IllegalTransition as exc:
            return self._conflict(job, exc, "a SCHEDULED, RUNNING or PAUSED", "requeued")
        return self._answer(request, job)

    @extend_schema(
        summary="Change a pending job",
        description=(
            "Changes a PENDING job's resources (gpus, gpu_memory_mb, cpus, memory_mb), "
            "time_limit, priority or dependencies; checked as a submission is (400 naming the "
            "field). A job that is not PENDING is a 409."
        ),
        request=JobUpdateSerializer,
        responses={
            200: JobSerializer,
            400: OpenApiResponse(OpenApiTypes.OBJECT, description="field -> list of messages"),
            404: ErrorSerializer,
            409: CancelConflictSerializer,
        },
    )
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        body = JobUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            job = services.job_update(
                job,
                actor=f"user:{request.user.get_username()}",
                owner=job.owner,
                **body.validated_data,
            )
        except IllegalTransition as exc:
            return self._conflict(job, exc, "a PENDING", "changed")
        except DjangoValidationError as exc:
            errors = exc.message_dict
            if "time_limit_s" in errors:
                errors["time_limit"] = errors.pop("time_limit_s")
            raise ValidationError(errors) from None
        return self._answer(request, job)

    @extend_schema(
        summary="Preempt a job (staff)",
        description=(
            "Stops a SCHEDULED, RUNNING or PAUSED job and puts it back in the queue: its node "
            "sends SIGTERM, then SIGKILL after the grace (COSCHED_STOP_GRACE_S), so the job can "
            "checkpoint to COSCHED_CHECKPOINT_DIR; the attempt ends 'preempted' with the reason "
            "given, and the scheduler places the job again. Any other state is a 409; a user "
            "who is not staff gets a 403."
        ),
        request=PreemptSerializer,
        responses={
            200: JobSerializer,
            403: ErrorSerializer,
            404: ErrorSerializer,
            409: OpenApiResponse(CancelConflictSerializer, description="the job is not placed"),
        },
    )
    @action(detail=True, methods=["post"], permission_classes=[IsAdminUser])
    def preempt(self, request: Request, pk: str | None = None) -> Response:
        body = PreemptSerializer(data=request.data or {})
        body.is_valid(raise_exception=True)
        job = self.get_object()
        actor = f"user:{request.user.get_username()}"
        reason = body.validated_data.get("reason") or f"preempted by {actor}"
        try:
            job = services.job_preempt(job, actor=actor, reason=reason)
        except IllegalTransition as exc:
            return Response(
                {
                    "detail": (
                        f"job {job.pk} is {exc.current}: only a SCHEDULED, RUNNING or PAUSED job "
                        "can be preempted"
                    ),
                    "state": exc.current,
                },
                status=status.HTTP_409_CONFLICT,
            )
        job = selectors.job_for_user(request.user, job.pk)
        return Response(JobSerializer(job, context=self.get_serializer_context()).data)


@extend_schema_view(
    list=extend_schema(
        summary="List profiles (approved ones; staff: all)",
        parameters=[
            OpenApiParameter(
                "status",
                str,
                enum=list(ApplicationProfile.Status.values),
                description="staff: draft, approved or retired",
            ),
            OpenApiParameter("kind", str, enum=[k for k, _ in JOB_KINDS]),
            OpenApiParameter("search", str, description="substring of the profile name"),
        ],
    ),
    create=extend_schema(summary="Create a draft profile (staff)"),
    update=extend_schema(summary="Replace a profile's fields (staff)"),
    partial_update=extend_schema(summary="Change some of a profile's fields (staff)"),
    destroy=extend_schema(summary="Delete a profile no job uses (staff)"),
)
class ProfileViewSet(viewsets.ModelViewSet):
    """Application profiles: readable by every user (approved ones), writable by staff."""

    serializer_class = ProfileSerializer
    permission_classes = [IsStaffOrReadOnly]
    pagination_class = StandardPagination

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):  # schema generation
            return ApplicationProfile.objects.none()
        params = self.request.query_params
        return selectors.profiles_visible_to(
            self.request.user,
            status=params.get("status"),
            kind=params.get("kind"),
            search=params.get("search"),
        )

    def get_object(self) -> Any:
        profile = selectors.profile_for_user(self.request.user, self.kwargs["pk"])
        self.check_object_permissions(self.request, profile)
        return profile

    def perform_destroy(self, instance: Any) -> None:
        if instance.jobs.exists():
            raise ValidationError(
                {"detail": "jobs use this profile; retire it instead of deleting it"}
            )
        instance.delete()

    @extend_schema(summary="Approve a profile (staff)", request=None)
    @action(detail=True, methods=["post"], permission_classes=[IsAdminUser])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        profile = services.profile_approve(self.get_object(), actor=request.user)
        return Response(ProfileSerializer(profile, context=self.get_serializer_context()).data)

    @extend_schema(summary="Retire a profile (staff)", request=None)
    @action(detail=True, methods=["post"], permission_classes=[IsAdminUser])
    def retire(self, request: Request, pk: str | None = None) -> Response:
        profile = services.profile_retire(self.get_object(), actor=request.user)
        return Response(ProfileSerializer(profile, context=self.get_serializer_context()).data)

    @extend_schema(
        summary="Import profiles from a file (staff)",
        description=(
            "CSV or JSON in Cosched's schema (docs/profiles.md), nvprof `--csv --metrics` "
            "output or Nsight Compute `ncu --csv` output. All or nothing: one bad row rejects "
            "the file with every row-level error."
        ),
        request={
            "multipart/form-data": ProfileImportSerializer,
            "application/json": ProfileImportSerializer,
        },
        responses={
            201: ImportResultSerializer,
            400: OpenApiResponse(ImportErrorSerializer, description="row-level errors"),
            409: OpenApiResponse(
                ImportErrorSerializer,
                description="another import stored the same profile meanwhile: nothing imported",
            ),
        },
    )
    @action(
        detail=False,
        methods=["post"],
        url_path="import",
        permission_classes=[IsAdminUser],
        parser_classes=[MultiPartParser, FormParser, BoundedJSONParser],
    )
    def import_profiles(self, request: Request) -> Response:
        try:
            body = request.data
        except ParseError as exc:  # not JSON / not a form: the documented import error shape
            return Response(
                {
                    "detail": "nothing imported: the request body could not be parsed",
                    "errors": [{"row": None, "field": "body", "message": str(exc.detail)}],
                },
                status=status.HTTP_400_BAD_REQUEST,
            )
        form = ProfileImportSerializer(data=body)
        if not form.is_valid():  # the request itself is wrong: same shape as a file's errors
            errors = [
                {"row": None, "field": name, "message": str(message)}
                for name, messages in form.errors.items()
                for message in (messages if isinstance(messages, list) else [messages])
            ]
            return Response(
                {
                    "detail": f"nothing imported: {len(errors)} error(s) in the request",
                    "errors": errors,
                },
                status=status.HTTP_400_BAD_REQUEST,
            )
        data = form.validated_data
        filename = None
        fmt = data.get("format")
        if data.get("file") is not None:
            content: bytes | str = data["file"].read()
            filename = data["file"].name
        elif data.get("content") is not None:
            content = data["content"]
        else:
            content = json.dumps(data["profiles"])
            fmt = "json"
        options = {k: data[k] for k in ("name", "version", "kind") if data.get(k)}
        try:
            result = services.profile_import(
                content,
                actor=request.user,
                fmt=fmt,
                filename=filename,
                status=data["status"],
                source=data["source"],
                update_existing=data["update_existing"],
                options=options,
            )
        except ProfileImportError as exc:
            conflict = isinstance(exc, ProfileImportConflict)
            return Response(
                {
                    "detail": f"nothing imported: {len(exc.errors)} error(s) in the file"
                    if not conflict
                    else "nothing imported: another import stored the same profile meanwhile",
                    "errors": [e.as_dict() for e in exc.errors],
                },
                status=status.HTTP_409_CONFLICT if conflict else status.HTTP_400_BAD_REQUEST,
            )
        profiles = selectors.profiles_visible_to(request.user).filter(
            pk__in=[p.pk for p in result.profiles]
        )
        return Response(
            {
                "created": [p.pk for p in result.created],
                "updated": [p.pk for p in result.updated],
                "profiles": ProfileSerializer(
                    profiles, many=True, context=self.get_serializer_context()
                ).data,
            },
            status=status.HTTP_201_CREATED,
        )


_NODE_OP_ERRORS = {
    400: ErrorSerializer,
    403: ErrorSerializer,
    404: ErrorSerializer,
}


@extend_schema_view(
    list=extend_schema(summary="Cluster nodes with their GPUs"),
    retrieve=extend_schema(
        summary="One node, by id or by name",
        parameters=[
            OpenApiParameter("id", str, OpenApiParameter.PATH, description="node id or name")
        ],
    ),
)
class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = NodeSerializer
    pagination_class = StandardPagination
    lookup_value_regex = "[^/]+"

    def get_queryset(self) -> Any:
        return selectors.nodes_with_gpus()

    def get_object(self) -> Any:
        """``/nodes/<id>/`` or ``/nodes/<name>/`` (what ``cosched nodes drain NAME`` sends)."""
        value = str(self.kwargs[self.lookup_url_kwarg or self.lookup_field])
        queryset = self.filter_queryset(self.get_queryset())
        node = queryset.filter(name=value).first()
        if node is None and value.isdigit():
            node = queryset.filter(pk=int(value)).first()
        if node is None:
            raise NotFound(f"no node {value!r}")
        self.check_object_permissions(self.request, node)
        return node

    def _operate(self, request: Request, op: str) -> Response:
        node = self.get_object()
        body = NodeOperationSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        reason = body.validated_data.get("reason")
        actor = f"user:{request.user.get_username()}"
        requeued: list[int] = []
        try:
            if op == "drain":
                node = node_ops.node_drain(node, actor=actor, reason=reason)
            elif op == "down":
                node, requeued = node_ops.node_down(node, actor=actor, reason=reason)
            else:
                node = node_ops.node_resume(node, actor=actor)
        except node_ops.NodeOpError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from None
        data = NodeSerializer(node, context=self.get_serializer_context()).data
        if op == "down":
            return Response({"node": data, "requeued": requeued})
        return Response(data)

    @extend_schema(
        summary="Drain a node (staff): it finishes its jobs and gets no new ones",
        request=NodeOperationSerializer,
        responses={200: NodeSerializer, **_NODE_OP_ERRORS},
    )
    @action(detail=True, methods=["post"], permission_classes=[IsAdminUser])
    def drain(self, request: Request, pk: str | None = None) -> Response:
        return self._operate(request, "drain")

    @extend_schema(
        summary="Take a node down (staff): its jobs go back to the queue, it gets none",
        request=NodeOperationSerializer,
        responses={200: NodeDownResultSerializer, **_NODE_OP_ERRORS},
    )
    @action(detail=True, methods=["post"], permission_classes=[IsAdminUser])
    def down(self, request: Request, pk: str | None = None) -> Response:
        return self._operate(request, "down")

    @extend_schema(
        summary="Resume a drained or downed node (staff)",
        request=None,
        responses={200: NodeSerializer, **_NODE_OP_ERRORS},
    )
    @action(detail=True, methods=["post"], permission_classes=[IsAdminUser])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        return self._operate(request, "resume")


@extend_schema_view(list=extend_schema(summary="Every GPU of the cluster"))
class GpuViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = GpuSerializer
    pagination_class = StandardPagination

    def get_queryset(self) -> Any:
        return selectors.gpus_all()


@extend_schema(summary="Who am I", responses=MeSerializer)
@api_view(["GET"])
def me(request: Request) -> Response:
    """The authenticated user (the CLI uses it to check its token)."""
    user = request.user
    auth = "session" if request.auth is None else "token"
    return Response(
        MeSerializer(
            {
                "id": user.pk,
                "username": user.get_username(),
                "email": user.email,
                "is_staff": user.is_staff,
                "auth": auth,
            }
        ).data
    )
