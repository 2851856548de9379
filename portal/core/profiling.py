"""The profiling command (``cosched profile APP --models H100,A30 [--with OTHER]``, the API's
``POST /api/v1/profiles/{id}/profiling/``, the profile page's staff form): short solo and pair
runs of an application submitted as ordinary jobs, pinned to each GPU model (the job parameter
``gpu_model``), tagged ``profiling=<run>``. What they measure (throughput from their progress,
memory peak and utilisation from their GPU readings) goes into the profile's measured draft
(``portal.core.observations.update_profile_draft``) as their observations arrive; the draft
waits for an administrator's review.

A pair (``with_profile``) is two jobs submitted together, the application and the other one,
on the same model: they share a GPU when the active policy co-locates (e.g. ``binpack``), and
their windows side by side are the pair's co-run observations.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.exceptions import ValidationError

from portal.core.models import ApplicationProfile, Gpu, Job
from portal.core.services import job_submit
from scheduler.policies.framework import GPU_MODEL_PARAM

PROFILING_PARAM = "profiling"
DEFAULT_SCALE = 0.05  # emulated runs: the profile's time x this


def default_command(profile: ApplicationProfile, scale: float) -> str:
    """The application's run when no command is given: the emulator of its profile."""
    return f"python -m workers.emulate --profile {profile.name} --scale {scale:g}"


def profiling_submit(
    actor: Any,
    profile: ApplicationProfile,
    *,
    models: list[str],
    with_profile: ApplicationProfile | None = None,
    command: str | None = None,
    scale: float = DEFAULT_SCALE,
) -> tuple[str, list[Job]]:
    """Submit a profiling run of ``profile``; returns (run id, its jobs). Raises
    ``ValidationError`` naming the field (``models``, ``scale``) for bad input."""
    models = [m.strip() for m in models if m and m.strip()]
    registered = set(Gpu.objects.values_list("model", flat=True).distinct())
    errors: dict[str, list[str]] = {}
    if not models:
        errors["models"] = ["name at least one GPU model, e.g. H100,A30"]
    unknown = sorted(set(models) - registered)
    if unknown:
        errors["models"] = [
            f"no GPU of model {', '.join(unknown)} in the cluster "
            f"(registered: {', '.join(sorted(registered)) or 'none'})"
        ]
    if not 0 < scale <= 10:
        errors["scale"] = ["must be in (0, 10]"]
    if errors:
        raise ValidationError(errors)
    run = uuid.uuid4().hex[:8]
    jobs: list[Job] = []

    def submit(app: ApplicationProfile, model: str, role: str) -> None:
        cmd = command if command and app == profile else default_command(app, scale)
        job, _ = job_submit(
            actor,
            name=f"profile {app.name} {role} on {model}",
            command=cmd,
            profile=app,
            gpus=1,
            cpus=1,
            params={GPU_MODEL_PARAM: model, PROFILING_PARAM: run, "profiling_role": role},
        )
        jobs.append(job)

    for model in models:
        submit(profile, model, "solo")
        if with_profile is not None:
            submit(profile, model, f"pair with {with_profile.name}")
            submit(with_profile, model, f"pair with {profile.name}")
    return run, jobs


def profiling_jobs(profile: ApplicationProfile) -> list[Job]:
    """The profiling jobs of ``profile``'s name, newest first."""
    return list(
        Job.objects.filter(params__has_key=PROFILING_PARAM, profile__name=profile.name).order_by(
            "-submitted_at", "-id"
        )
    )
