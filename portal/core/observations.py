"""What the cluster measures of its jobs, and what it learns from it (docs/profiles.md,
"Measured on the cluster").

- **GPU readings** (``GpuReading``): the node agent's per-attempt GPU memory and SM utilisation
  (``workers.protocol.JOB_GPU_MEMORY`` / ``JOB_GPU_UTIL`` samples), one row per attempt, GPU
  and moment.
- **Observations** (``JobObservation``, the fields of ``scheduler.knowledge.Observation``): each
  attempt's ``progress`` samples (the emulator's progress lines, the SDK's, or any program's
  ``@cosched progress <fraction> [steps=N]`` line) are cut into windows of at least
  ``COSCHED_OBSERVATION_WINDOW_S`` seconds on one GPU model, under one sharing mode, beside one
  set of co-runner types; a window that would mix two sets (a co-runner came or went) or a pause
  is dropped and a new one begins. A job that completes adds a ``completed`` observation.
- **Knowledge**: ``build_knowledge`` feeds the newest ``COSCHED_OBSERVATIONS_PER_TYPE``
  observations of the given job types to ``scheduler.knowledge.Knowledge``; the scheduling cycle
  hands it to the policy as ``ClusterState.knowledge``.
- **Measured profile drafts** (``update_profile_draft``): a profile's observations and readings
  become a draft version of the profile (``<version>-m<N>``, source ``monitored``) whose measured
  numbers say where they come from ("measured on h100-1, 12 runs, 2026-11-27");
  ``COSCHED_MEASURED_PROFILES`` says whether an administrator approves it (``draft``, the
  default), it is approved at once (``approve``) or none is written (``off``).
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Avg, Count, Max
from django.utils import timezone

from portal.core.models import (
    ApplicationProfile,
    GpuReading,
    Job,
    JobObservation,
    Node,
    Placement,
    ProfileGpuTime,
    ProfileMemoryStep,
)
from portal.core.states import JobState
from scheduler.domain import SharingMode
from scheduler.knowledge import Knowledge
from scheduler.knowledge.observations import Observation, ObservationKind
from workers.protocol import JOB_GPU_MEMORY, JOB_GPU_UTIL, JOB_PROGRESS, JOB_STEPS
from workers.protocol import Sample as WireSample

log = logging.getLogger(__name__)

#: Profile fields a measured draft fills, besides the solo time per GPU model.
MEASURED_FIELDS = ("gpu_memory_max_mb", "gpu_memory_avg_mb", "gpu_util_pct")
_DRAFT_SUFFIX = re.compile(r"^(?P<root>.*)-m(?P<n>\d+)$")


def _setting(name: str, default: Any) -> Any:
    return settings.COSCHED.get(name, default)


def job_type_key(job: Job) -> str:
    """``JobSpec.type_key()`` of a job row: its ``job_type`` parameter, else its profile's
    name, else ``#<id>``."""
    job_type = (job.params or {}).get("job_type")
    if job_type:
        return str(job_type)
    if job.profile_id is not None and job.profile is not None:
        return job.profile.name
    return f"#{job.pk}"


# --- readings ----------------------------------------------------------------------------------


def record_job_samples(node: Node, samples: Sequence[WireSample]) -> None:
    """Store the per-attempt samples of one sync (those of current attempts only): GPU
    readings as ``GpuReading`` rows, progress as observation windows."""
    readings: dict[tuple[int, int, int, float], dict[str, float]] = {}
    progress: dict[tuple[int, int], tuple[float, float]] = {}
    steps: dict[tuple[int, int], tuple[float, float]] = {}
    for s in samples:
        if s.job_id is None or s.attempt is None:
            continue
        key = (s.job_id, s.attempt)
        if s.metric in (JOB_GPU_MEMORY, JOB_GPU_UTIL) and s.gpu_index is not None:
            row = readings.setdefault((s.job_id, s.attempt, s.gpu_index, s.at), {})
            row["memory_mb" if s.metric == JOB_GPU_MEMORY else "util_pct"] = s.value
        elif s.metric == JOB_PROGRESS and (key not in progress or s.at >= progress[key][0]):
            progress[key] = (s.at, s.value)
        elif s.metric == JOB_STEPS and (key not in steps or s.at >= steps[key][0]):
            steps[key] = (s.at, s.value)
    if readings:
        GpuReading.objects.bulk_create(
            [
                GpuReading(
                    job_id=job,
                    attempt=attempt,
                    node=node,
                    gpu_index=index,
                    at=datetime.fromtimestamp(at, UTC),
                    memory_mb=values.get("memory_mb"),
                    util_pct=values.get("util_pct"),
                )
                for (job, attempt, index, at), values in readings.items()
            ],
            ignore_conflicts=True,
        )
    for (job, attempt), (at, fraction) in progress.items():
        counted = steps.get((job, attempt))
        advance_window(job, attempt, at, fraction, None if counted is None else counted[1])


def readings_of(job: Job) -> list[dict[str, Any]]:
    """The job's GPU readings, oldest first, as the API returns them."""
    return [
        {
            "attempt": r.attempt,
            "node": r.node.name if r.node is not None else None,
            "gpu_index": r.gpu_index,
            "at": r.at,
            "memory_mb": r.memory_mb,
            "util_pct": r.util_pct,
        }
        for r in GpuReading.objects.filter(job=job).select_related("node").order_by("at", "pk")
    ]


def reading_summary(job: Job) -> list[dict[str, Any]]:
    """Per attempt: peak and mean GPU memory (MB, summed over its GPUs at each moment is not
    attempted: per GPU) and mean SM utilisation, over its readings."""
    rows = (
        GpuReading.objects.filter(job=job)
        .values("attempt")
        .annotate(
            n=Count("id"),
            memory_peak_mb=Max("memory_mb"),
            memory_mean_mb=Avg("memory_mb"),
            util_mean_pct=Avg("util_pct"),
        )
        .order_by("attempt")
    )
    return [dict(r) for r in rows]


# --- observation windows --------------------------------------------------------------------------


def _co_runners(placement: Placement) -> list[str]:
    """The type keys of every other job holding one of ``placement``'s GPUs now, sorted."""
    gpu_ids = [g.pk for g in placement.gpus.all()]
    if not gpu_ids:
        return []
    others = (
        Placement.objects.filter(active=True, gpus__in=gpu_ids)
        .exclude(pk=placement.pk)
        .select_related("job__profile")
        .distinct()
    )
    return sorted(job_type_key(p.job) for p in others)


def _gpu_model(placement: Placement) -> str | None:
    gpus = list(placement.gpus.all())
    return gpus[0].model if gpus else None


def advance_window(
    job_id: int, attempt: int, at_s: float, fraction: float, steps: float | None
) -> JobObservation | None:
    """Move attempt ``(job_id, attempt)``'s progress window to ``(at_s, fraction, steps)``:
    store the window as an observation when it is long enough and unbroken (module docstring)
    and begin the next one there. Returns the observation stored, if any."""
    # Most samples only grow the window: one cheap read, no lock, no co-runner query. A
    # co-runner that came and went inside a window goes unnoticed; one that came or went
    # between its ends drops it.
    held = (
        Placement.objects.filter(job_id=job_id, attempt=attempt, active=True)
        .values("progress_mark", "job__state")
        .first()
    )
    if held is None:
        return None
    mark = held["progress_mark"] or {}
    if (
        mark
        and held["job__state"] == JobState.RUNNING
        and fraction >= float(mark["fraction"])
        and at_s - float(mark["at"]) < float(_setting("OBSERVATION_WINDOW_S", 10.0))
    ):
        return None
    with transaction.atomic():
        placement = (
            Placement.objects.select_for_update(of=("self",))
            .select_related("job__profile", "job__owner", "node")
            .prefetch_related("gpus")
            .filter(job_id=job_id, attempt=attempt, active=True)
            .first()
        )
        if placement is None:
            return None
        job = placement.job
        co = _co_runners(placement)
        mark = placement.progress_mark or {}
        here = {"at": at_s, "fraction": fraction, "steps": steps, "co": co}
        if job.state != JobState.RUNNING:
            placement.progress_mark = {}
            placement.save(update_fields=["progress_mark"])
            return None
        if not mark or mark.get("co") != co or fraction < float(mark["fraction"]):
            placement.progress_mark = here
            placement.save(update_fields=["progress_mark"])
            return None
        window = at_s - float(mark["at"])
        if window < float(_setting("OBSERVATION_WINDOW_S", 10.0)) or fraction <= mark["fraction"]:
            return None  # keep the mark: the window grows
        done_steps = None
        if steps is not None and mark.get("steps") is not None:
            done_steps = max(0.0, steps - float(mark["steps"]))
        row = JobObservation.objects.create(
            job=job,
            attempt=attempt,
            kind=ObservationKind.PROGRESS.value,
            job_type=job_type_key(job),
            at=datetime.fromtimestamp(at_s, UTC),
            window_s=window,
            gpu_model=_gpu_model(placement),
            gpus=max(1, placement.gpus.count()) if job.gpus else 0,
            mode=placement.sharing_mode,
            co_runners=co,
            progress_from=min(1.0, float(mark["fraction"])),
            progress_to=min(1.0, fraction),
            steps=done_steps,
            owner=str(job.owner_id),
            node=placement.node.name,
            spread=placement.parts.count() > 1,
        )
        placement.progress_mark = here
        placement.save(update_fields=["progress_mark"])
    _after_observation(job)
    return row


def close_and_complete(job_id: int, placement_id: int) -> None:
    """A job just completed in attempt ``placement_id``: its last progress window runs to
    1.0 at the attempt's end (when long enough), and a ``completed`` observation is added."""
    job = Job.objects.select_related("profile").filter(pk=job_id).first()
    placement = (
        Placement.objects.select_related("node")
        .prefetch_related("gpus")
        .filter(pk=placement_id)
        .first()
    )
    if job is None or placement is None or job.state != JobState.COMPLETED:
        return
    mark = placement.progress_mark or {}
    end = placement.released_at or job.finished_at or timezone.now()
    if mark and float(mark["fraction"]) < 1.0:
        window = end.timestamp() - float(mark["at"])
        if window >= float(_setting("OBSERVATION_WINDOW_S", 10.0)):
            JobObservation.objects.create(
                job=job,
                attempt=placement.attempt,
                kind=ObservationKind.PROGRESS.value,
                job_type=job_type_key(job),
                at=end,
                window_s=window,
                gpu_model=_gpu_model(placement),
                gpus=max(1, placement.gpus.count()) if job.gpus else 0,
                mode=placement.sharing_mode,
                co_runners=list(mark.get("co") or []),
                progress_from=float(mark["fraction"]),
                progress_to=1.0,
                owner=str(job.owner_id),
                node=placement.node.name,
                spread=placement.parts.count() > 1,
            )
    Placement.objects.filter(pk=placement.pk).update(progress_mark={})
    record_completion(job)


def attempt_seconds(start: datetime, end: datetime) -> float:
    """Seconds one attempt ran, from its start (``started_at``, else ``created_at``) to its
    end (``released_at``, else the job's end or now); never negative."""
    return max(0.0, (end - start).total_seconds())


def record_completion(job: Job) -> JobObservation | None:
    """A ``completed`` observation of a job that just completed: its run time over every
    attempt (started to released, the last one to ``finished_at``)."""
    total = 0.0
    last: Placement | None = None
    for p in job.placements.order_by("attempt"):
        end = p.released_at or job.finished_at or timezone.now()
        total += attempt_seconds(p.started_at or p.created_at, end)
        last = p
    if total <= 0 or last is None:
        return None
    row = JobObservation.objects.create(
        job=job,
        attempt=last.attempt,
        kind=ObservationKind.COMPLETED.value,
        job_type=job_type_key(job),
        at=job.finished_at or timezone.now(),
        window_s=total,
        gpu_model=_gpu_model(last),
        gpus=job.gpus,
        mode=last.sharing_mode,
        co_runners=[],
        progress_from=0.0,
        progress_to=1.0,
        owner=str(job.owner_id),
        node=last.node.name,
    )
    _after_observation(job)
    return row


def to_observation(row: JobObservation) -> Observation:
    """The ``scheduler.knowledge.Observation`` of a stored row."""
    return Observation(
        kind=ObservationKind(row.kind),
        job_id=str(row.job_id),
        job_type=row.job_type,
        at_s=row.at.timestamp(),
        window_s=row.window_s,
        gpu_model=row.gpu_model,
        gpus=row.gpus,
        mode=SharingMode(row.mode),
        co_runners=tuple(row.co_runners or ()),
        progress_from=row.progress_from,
        progress_to=row.progress_to,
        steps=row.steps,
        owner=row.owner or None,
        node=row.node or None,
        spread=row.spread,
    )


def observations_of(job: Job) -> list[dict[str, Any]]:
    """The job's observations as the API returns them (``Observation.to_dict`` plus the
    attempt)."""
    return [
        {**to_observation(r).to_dict(), "attempt": r.attempt}
        for r in JobObservation.objects.filter(job=job).order_by("at", "pk")
    ]


def recent_observations(types: Iterable[str], per_type: int | None = None) -> list[Observation]:
    """The newest ``per_type`` observations of each of ``types``, oldest first."""
    per_type = per_type or int(_setting("OBSERVATIONS_PER_TYPE", 200))
    out: list[JobObservation] = []
    for job_type in sorted(set(types)):
        out.extend(
            JobObservation.objects.filter(job_type=job_type).order_by("-at", "-pk")[:per_type]
        )
    out.sort(key=lambda r: (r.at, r.pk))
    return [to_observation(r) for r in out]


def build_knowledge(types: Iterable[str], *, completions: int = 0) -> Knowledge:
    """A ``Knowledge`` that has seen the recent observations of ``types`` and, with
    ``completions`` > 0, that many of the newest completions of every other type (the length
    distribution a job of unknown length is ranked by: ``Knowledge.duration_samples``)."""
    types = set(types)
    observations = recent_observations(types)
    if completions > 0:
        rows = (
            JobObservation.objects.filter(kind=ObservationKind.COMPLETED.value)
            .exclude(job_type__in=types)
            .order_by("-at", "-pk")[:completions]
        )
        observations += [to_observation(r) for r in rows]
        observations.sort(key=lambda o: o.at_s)
    knowledge = Knowledge()
    knowledge.observe_all(observations)
    return knowledge


# --- measured profile drafts ----------------------------------------------------------------------


def _after_observation(job: Job) -> None:
    if job.profile_id is None or _setting("MEASURED_PROFILES", "draft") == "off":
        return
    try:
        update_profile_draft(job.profile)
    except Exception as exc:  # a draft is a convenience: never fail the sync for it
        log.warning("profile %s: measured draft not updated: %s", job.profile, exc)


def _root(profile: ApplicationProfile) -> tuple[str, str]:
    """(name, version root) of a profile: a measured version ``2-m3`` has root ``2``."""
    match = _DRAFT_SUFFIX.match(profile.version)
    return profile.name, (match.group("root") if match else profile.version)


def _source(nodes: Iterable[str], runs: int, when: datetime) -> str:
    where = ", ".join(sorted(set(n for n in nodes if n))) or "the cluster"
    return f"measured on {where}, {runs} run{'s' if runs != 1 else ''}, {when.date().isoformat()}"


def measured_numbers(profile: ApplicationProfile) -> dict[str, tuple[float, str]]:
    """What the cluster measured of jobs using ``profile`` (any version of its name and root):
    field (``gpu_time_s.<model>`` for solo times) -> (value, source)."""
    name, root = _root(profile)
    versions = [
        p.pk for p in ApplicationProfile.objects.filter(name=name) if _root(p) == (name, root)
    ]
    out: dict[str, tuple[float, str]] = {}
    solo = JobObservation.objects.filter(
        job__profile_id__in=versions,
        kind=ObservationKind.PROGRESS.value,
        co_runners=[],
        spread=False,
        gpu_model__isnull=False,
    ).exclude(mode=SharingMode.MIG.value)
    by_model: dict[str, list[JobObservation]] = defaultdict(list)
    for row in solo:
        by_model[str(row.gpu_model)].append(row)
    for model, rows in by_model.items():
        done = sum(r.progress_to - r.progress_from for r in rows)
        seconds = sum(r.window_s for r in rows)
        if done <= 0 or seconds <= 0:
            continue
        runs = len({r.job_id for r in rows})
        newest = max(r.at for r in rows)
        out[f"gpu_time_s.{model}"] = (seconds / done, _source((r.node for r in rows), runs, newest))
    readings = GpuReading.objects.filter(job__profile_id__in=versions, memory_mb__isnull=False)
    agg = readings.aggregate(
        peak=Max("memory_mb"), mean=Avg("memory_mb"), util=Avg("util_pct"), newest=Max("at")
    )
    if agg["peak"] is not None:
        runs = readings.values("job_id").distinct().count()
        nodes = readings.values_list("node__name", flat=True).distinct()
        src = _source(nodes, runs, agg["newest"])
        out["gpu_memory_max_mb"] = (float(agg["peak"]), src)
        out["gpu_memory_avg_mb"] = (float(agg["mean"]), src)
        if agg["util"] is not None:
            out["gpu_util_pct"] = (float(agg["util"]), src)
    return out


_COPIED = [
    f.name
    for f in ApplicationProfile._meta.concrete_fields
    if f.name
    not in {
        "id",
        "name",
        "version",
        "status",
        "source",
        "sources",
        "created_by",
        "approved_by",
        "approved_at",
        "created_at",
        "updated_at",
    }
]


def update_profile_draft(
    profile: ApplicationProfile,
    *,
    actor: Any = None,
    extra: dict[str, tuple[float, str]] | None = None,
) -> ApplicationProfile | None:
    """Write what was measured of ``profile`` into its open draft version (created from the
    newest approved version of its root when there is none): solo times per GPU model, memory
    peak and mean, utilisation, each with its source. ``extra``: more measured numbers (the
    profiling command's). Returns the draft (None when nothing was measured)."""
    numbers = measured_numbers(profile)
    numbers.update(extra or {})
    if not numbers:
        return None
    name, root = _root(profile)
    with transaction.atomic():
        family = list(ApplicationProfile.objects.select_for_update().filter(name=name))
        family = [p for p in family if _root(p) == (name, root)]
        draft = next(
            (
                p
                for p in family
                if p.status == ApplicationProfile.Status.DRAFT
                and p.source == ApplicationProfile.Source.MONITORED
            ),
            None,
        )
        if draft is None:
            base = max(
                (p for p in family if p.status == ApplicationProfile.Status.APPROVED),
                key=lambda p: (p.approved_at or p.created_at, p.pk),
                default=profile,
            )
            taken = [int(m.group("n")) for p in family if (m := _DRAFT_SUFFIX.match(p.version))]
            draft = ApplicationProfile(
                name=name,
                version=f"{root}-m{max(taken, default=0) + 1}",
                status=ApplicationProfile.Status.DRAFT,
                source=ApplicationProfile.Source.MONITORED,
                sources=dict(base.sources or {}),
                created_by=actor,
                **{f: getattr(base, f) for f in _COPIED},
            )
            draft.save()
            for t in base.gpu_times.all():
                ProfileGpuTime.objects.create(profile=draft, gpu_model=t.gpu_model, time_s=t.time_s)
            for step in base.memory_steps.all():
                ProfileMemoryStep.objects.create(
                    profile=draft,
                    index=step.index,
                    start_fraction=step.start_fraction,
                    from_mb=step.from_mb,
                    to_mb=step.to_mb,
                )
        sources = dict(draft.sources or {})
        for field, (value, source) in sorted(numbers.items()):
            sources[field] = source
            if field.startswith("gpu_time_s."):
                model = field.split(".", 1)[1]
                ProfileGpuTime.objects.update_or_create(
                    profile=draft, gpu_model=model, defaults={"time_s": round(value, 3)}
                )
            else:
                setattr(draft, field, round(value, 3))
        draft.sources = sources
        draft.save()
    if _setting("MEASURED_PROFILES", "draft") == "approve":
        from portal.core.services import profile_approve

        profile_approve(draft, actor=actor)
    return draft
