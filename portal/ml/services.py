"""Writes of ``portal.ml``: training runs, the model registry (activation), live co-run samples,
the periodic retrain (ALGORITHMS.md §2; docs/coscheml.md).

- ``training_run_create`` + ``training_run_start`` queue a run (a Celery task with a broker, a
  background thread in the embedded default); ``training_run_execute`` claims it with a
  conditional update (a duplicate delivery does nothing), trains on the Gavel measurements plus
  the live co-run samples, reports progress on the run row, and stores one ``TrainedModel`` per
  algorithm. Models are *proposed*: staff compare them and activate one (``model_activate``).
- ``corun_samples_collect`` turns live Slow-Down reports of jobs that shared a GPU with exactly
  one other job into ``CoRunSample`` rows (the online-learning samples).
- ``retrain_propose`` starts a run when enough new live samples arrived since the last model.
"""

from __future__ import annotations

import hashlib
import logging
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import close_old_connections, transaction
from django.db.models import Count, Q
from django.utils import timezone

from portal.celery import app
from portal.core.models import MetricSample, Placement
from portal.ml.models import CoRunSample, TrainedModel, TrainingRun

log = logging.getLogger(__name__)

# The Celery task that trains a model (portal.ml.tasks), enqueued by this name.
TRAIN_RUN_TASK = "cosched.ml_train_run"

DEFAULTS: dict[str, Any] = {
    "ML_RETRAIN_MIN_NEW_SAMPLES": 20,  # live samples since the newest model before a retrain
    "ML_CORUN_LOOKBACK_DAYS": 7,  # how far back co-runs are collected
    "ML_CORUN_MIN_REPORTS": 3,  # Slow-Down reports needed for one sample
    "ML_CORUN_MIN_COVER": 0.8,  # share of the job's elapsed time the pairing must cover
    "ML_CORUN_MIN_OVERLAP_S": 30,  # shortest pairing that counts, seconds
}


def ml_setting(name: str) -> Any:
    """``settings.COSCHED[name]`` if set, else the documented default above."""
    return (getattr(settings, "COSCHED", {}) or {}).get(name, DEFAULTS[name])


class TrainingError(ValueError):
    """A training request was malformed (unknown algorithm or validation)."""


# -- live samples -------------------------------------------------------------------------------


def live_training_samples() -> list[Any]:
    """Every ``CoRunSample`` as a ``scheduler.learning.datasets.PairSample`` (family "live")."""
    from portal.core.adapters import _gpu_model_key, profile_to_domain
    from scheduler.catalog import CATALOG
    from scheduler.domain import GpuSpec
    from scheduler.learning.datasets import PairSample

    rows = list(
        CoRunSample.objects.select_related("profile_a", "profile_b")
        .prefetch_related(
            "profile_a__gpu_times",
            "profile_a__memory_steps",
            "profile_b__gpu_times",
            "profile_b__memory_steps",
        )
        .order_by("id")
    )
    domain: dict[int, Any] = {}
    out = []
    for row in rows:
        for p in (row.profile_a, row.profile_b):
            if p.pk not in domain:
                domain[p.pk] = profile_to_domain(p)
        key = _gpu_model_key(row.gpu_model)
        gpu = CATALOG.get(key) or GpuSpec(key, "", 0, 0, 0.0, 0.0)
        out.append(
            PairSample(
                a=domain[row.profile_a_id],
                b=domain[row.profile_b_id],
                gpu=gpu,
                norm=row.norm,
                family="live",
                app_a=f"live:{row.profile_a.name}",
                app_b=f"live:{row.profile_b.name}",
                source=f"co-run of jobs {row.job_a_id} and {row.job_b_id}",
            )
        )
    return out


def corun_samples_collect(*, now: datetime | None = None) -> int:
    """Create or refresh a ``CoRunSample`` for every job that shared one GPU with exactly one
    other job long enough; returns how many rows were written.

    A sample of job a next to job b is the median of a's live Slow-Down reports (metric
    ``slowdown``, ALGORITHMS.md §5) taken while b was its only co-runner and while the pairing
    covered at least ``ML_CORUN_MIN_COVER`` of a's time since it started: Slow-Down counts from
    the job's first start, so a report taken soon after a long solo stretch would understate the
    co-run's effect. Jobs without a profile give no sample (the model needs their features).
    """
    now = now or timezone.now()
    since = now - timedelta(days=float(ml_setting("ML_CORUN_LOOKBACK_DAYS")))
    min_reports = int(ml_setting("ML_CORUN_MIN_REPORTS"))
    min_cover = float(ml_setting("ML_CORUN_MIN_COVER"))
    min_overlap = timedelta(seconds=float(ml_setting("ML_CORUN_MIN_OVERLAP_S")))
    placements = list(
        Placement.objects.filter(Q(released_at__isnull=True) | Q(released_at__gte=since))
        .filter(created_at__lte=now, job__profile__isnull=False)
        .annotate(n_gpus=Count("gpus"))
        .filter(n_gpus=1)
        .select_related("job")
        .prefetch_related("gpus")
    )
    by_gpu: dict[int, list[tuple[Placement, Any]]] = defaultdict(list)
    for p in placements:
        for gpu in p.gpus.all():
            by_gpu[gpu.pk].append((p, gpu))
    written = 0
    for group in by_gpu.values():
        if len(group) < 2:
            continue
        spans = [(p, gpu, p.created_at, p.released_at or now) for p, gpu in group]
        for p, gpu, p_start, p_end in spans:
            for q, _gpu, q_start, q_end in spans:
                if q.pk == p.pk or q.job_id == p.job_id:
                    continue
                start, end = max(p_start, q_start), min(p_end, q_end)
                if end - start < min_overlap:
                    continue
                others = [
                    (s, e)
                    for r, _g, s, e in spans
                    if r.pk not in (p.pk, q.pk) and s < end and e > start
                ]
                job_start = p.job.started_at or p_start
                values = []
                for at, value in MetricSample.objects.filter(
                    job_id=p.job_id, metric="slowdown", at__gte=start, at__lte=end
                ).values_list("at", "value"):
                    elapsed = (at - job_start).total_seconds()
                    paired = (at - start).total_seconds()
                    if elapsed <= 0 or paired < min_cover * elapsed:
                        continue
                    if any(s <= at <= e for s, e in others):
                        continue
                    values.append(float(value))
                if len(values) < min_reports:
                    continue
                slowdown = max(1e-6, statistics.median(values))
                CoRunSample.objects.update_or_create(
                    job_a_id=p.job_id,
                    job_b_id=q.job_id,
                    defaults={
                        "profile_a_id": p.job.profile_id,
                        "profile_b_id": q.job.profile_id,
                        "gpu_model": gpu.model,
                        "sharing_mode": p.sharing_mode,
                        "slowdown": slowdown,
                        "norm": 1.0 / slowdown,
                        "samples": len(values),
                        "window_start": start,
                        "window_end": end,
                    },
                )
                written += 1
    return written


# -- training -----------------------------------------------------------------------------------


def training_run_create(
    *,
    algorithms: Sequence[str] | None = None,
    validations: Sequence[str] | None = None,
    include_live: bool = True,
    seed: int = 0,
    source: str = TrainingRun.Source.ADMIN,
    user: Any = None,
) -> TrainingRun:
    """A queued run; unknown algorithm or validation names raise TrainingError."""
    from scheduler.learning.training import ALGORITHMS, VALIDATIONS

    algorithms = list(algorithms or ALGORITHMS)
    validations = list(validations or VALIDATIONS)
    bad = [a for a in algorithms if a not in ALGORITHMS]
    if bad:
        raise TrainingError(
            f"unknown algorithm(s) {', '.join(bad)}; known: {', '.join(ALGORITHMS)}"
        )
    bad = [v for v in validations if v not in VALIDATIONS]
    if bad:
        raise TrainingError(
            f"unknown validation(s) {', '.join(bad)}; known: {', '.join(VALIDATIONS)}"
        )
    return TrainingRun.objects.create(
        algorithms=algorithms,
        validations=validations,
        include_live=include_live,
        seed=seed,
        source=source,
        requested_by=user if getattr(user, "pk", None) else None,
    )


def training_run_start(run: TrainingRun) -> None:
    """Hand ``run`` to a worker after commit: the Celery task with a broker; without one (the
    embedded default, where tasks would run inside the web request) a background thread."""

    def go() -> None:
        if getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False):
            threading.Thread(
                target=_execute_in_thread, args=(run.pk,), name=f"train-{run.pk}", daemon=True
            ).start()
        else:
            app.tasks[TRAIN_RUN_TASK].delay(run.pk)  # portal.ml.tasks.train_run

    transaction.on_commit(go)


def _execute_in_thread(run_id: int) -> None:
    try:
        training_run_execute(run_id)
    except Exception:  # recorded on the run; a thread has nobody to raise to
        log.exception("training run %s failed", run_id)
    finally:
        close_old_connections()


def _progress_writer(run_id: int, extra: Callable[[int, int, str], None] | None) -> Callable:
    last = [0.0]

    def write(done: int, total: int, message: str) -> None:
        if extra is not None:
            extra(done, total, message)
        t = time.monotonic()
        if done < total and t - last[0] < 0.5:
            return  # at most two row updates a second
        last[0] = t
        TrainingRun.objects.filter(pk=run_id).update(
            progress_done=done, progress_total=total, message=message[:200]
        )

    return write


def training_run_execute(
    run_id: int, *, progress: Callable[[int, int, str], None] | None = None
) -> TrainingRun:
    """Claim run ``run_id`` (QUEUED -> RUNNING, conditional) and train it; returns the run.

    A run that is not queued any more (another worker took it) is returned untouched. Errors
    mark the run FAILED with the message and are raised again.
    """
    from scheduler.learning.datasets import gavel_training_set
    from scheduler.learning.training import train_models

    claimed = TrainingRun.objects.filter(pk=run_id, status=TrainingRun.Status.QUEUED).update(
        status=TrainingRun.Status.RUNNING, started_at=timezone.now(), message="loading data"
    )
    run = TrainingRun.objects.get(pk=run_id)
    if not claimed:
        return run
    try:
        live = live_training_samples() if run.include_live else []
        data = gavel_training_set(extra=live)
        report = train_models(
            data,
            run.algorithms,
            run.validations,
            seed=run.seed,
            progress=_progress_writer(run.pk, progress),
            name_prefix="",
        )
        with transaction.atomic():
            for algorithm, predictor in report.predictors.items():
                predictor.name = _unique_name(f"{algorithm}-{report.dataset_hash[:8]}-run{run.pk}")
                model_register(predictor, run=run, live_samples=len(live))
            TrainingRun.objects.filter(pk=run.pk).update(
                status=TrainingRun.Status.DONE,
                finished_at=timezone.now(),
                message=f"{len(report.predictors)} model(s) proposed",
            )
    except Exception as exc:
        TrainingRun.objects.filter(pk=run.pk).update(
            status=TrainingRun.Status.FAILED,
            finished_at=timezone.now(),
            error=f"{type(exc).__name__}: {exc}"[:4000],
        )
        raise
    run.refresh_from_db()
    return run


def model_register(
    predictor: Any, *, run: TrainingRun | None = None, live_samples: int = 0
) -> TrainedModel:
    """Store a fitted ``InterferencePredictor`` (bytes, data set hash, features, scores) as a
    proposed, inactive ``TrainedModel`` named after ``predictor.name`` (made unique)."""
    from scheduler.learning.predictor import dumps

    predictor.name = _unique_name(predictor.name)
    blob = dumps(predictor)
    meta = predictor.metadata
    return TrainedModel.objects.create(
        name=predictor.name,
        algorithm=predictor.algorithm,
        dataset_hash=str(meta.get("dataset_hash", "")),
        dataset=meta.get("dataset") or {},
        features=list(predictor.space.used_job_features),
        scores=meta.get("scores") or {},
        feasibility_scores=meta.get("feasibility_scores") or {},
        live_samples=live_samples,
        artifact=blob,
        artifact_sha256=hashlib.sha256(blob).hexdigest(),
        run=run,
    )


def _unique_name(base: str) -> str:
    name, k = base, 1
    while TrainedModel.objects.filter(name=name).exists():
        k += 1
        name = f"{base}-{k}"
    return name


def retrain_propose() -> TrainingRun | None:
    """Start a retrain (random forest, every validation, live samples included) when at least
    ``ML_RETRAIN_MIN_NEW_SAMPLES`` live samples were written since the newest model and no run
    is queued or running; else None. The new model is proposed, not activated."""
    busy = TrainingRun.objects.filter(
        status__in=[TrainingRun.Status.QUEUED, TrainingRun.Status.RUNNING]
    ).exists()
    if busy:
        return None
    newest = TrainedModel.objects.order_by("-created_at").values_list("created_at", flat=True)
    since = newest.first()
    fresh = CoRunSample.objects.all()
    if since is not None:
        fresh = fresh.filter(updated_at__gt=since)
    if fresh.count() < int(ml_setting("ML_RETRAIN_MIN_NEW_SAMPLES")):
        return None
    run = training_run_create(
        algorithms=["forest"], include_live=True, source=TrainingRun.Source.RETRAIN
    )
    training_run_start(run)
    return run


# -- registry -----------------------------------------------------------------------------------


def model_activate(model: TrainedModel, *, user: Any = None) -> TrainedModel:
    """Make ``model`` the active one (the one the ``coscheml`` policy loads); any other active
    model is deactivated in the same transaction."""
    with transaction.atomic():
        TrainedModel.objects.select_for_update().filter(active=True).exclude(pk=model.pk).update(
            active=False
        )
        TrainedModel.objects.filter(pk=model.pk).update(
            active=True,
            activated_at=timezone.now(),
            activated_by=user if getattr(user, "pk", None) else None,
        )
    model.refresh_from_db()
    return model


def model_deactivate(model: TrainedModel) -> TrainedModel:
    """No model active any more (``coscheml`` then uses its built-in model)."""
    TrainedModel.objects.filter(pk=model.pk).update(active=False)
    model.refresh_from_db()
    return model


def model_export(model: TrainedModel) -> bytes:
    """The model's bytes, loadable with ``scheduler.learning.predictor.loads`` (or as
    ``coscheml``'s ``model: file:PATH`` once written to a file)."""
    return bytes(TrainedModel.objects.values_list("artifact", flat=True).get(pk=model.pk))
