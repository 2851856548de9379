"""Reads of the interference models and co-run samples (``portal.ml``), including the loader the
scheduler's ``coscheml`` policy uses and the predicted-vs-measured heatmap."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DatabaseError
from django.db.models import Avg, Count

from portal.core.models import ApplicationProfile, Gpu, Job
from portal.core.states import PLACED, JobState
from portal.ml.models import CoRunSample, TrainedModel

log = logging.getLogger(__name__)

#: The heatmap shows at most this many profiles (most jobs first).
HEATMAP_MAX_PROFILES = 12
DEFAULT_GPU_MODEL = "V100"


def active_model_provider() -> tuple[str, Callable[[], bytes]] | None:
    """For ``scheduler.learning.runtime``: the active model's key and a loader of its bytes.

    The key changes with the model (id and artifact hash), so the scheduler reloads exactly when
    staff activate another model. Without database access (a pure test, a broken connection)
    there is no active model: the scheduler then uses its built-in model, and a cycle that
    cannot reach the database fails on its own queries anyway.
    """
    try:
        row = TrainedModel.objects.filter(active=True).values_list("pk", "artifact_sha256").first()
    except (DatabaseError, RuntimeError) as exc:  # RuntimeError: pytest-django's DB blocker
        log.debug("no active interference model (database unavailable: %s)", exc)
        return None
    if row is None:
        return None
    pk, sha = row

    def load() -> bytes:
        return bytes(TrainedModel.objects.values_list("artifact", flat=True).get(pk=pk))

    return f"db:{pk}:{sha[:16]}", load


def active_model() -> TrainedModel | None:
    return TrainedModel.objects.filter(active=True).defer("artifact").first()


def models_list() -> list[TrainedModel]:
    return list(TrainedModel.objects.defer("artifact").order_by("-created_at", "-id"))


def live_sample_count(since: Any = None) -> int:
    qs = CoRunSample.objects.all()
    if since is not None:
        qs = qs.filter(updated_at__gt=since)
    return qs.count()


def model_brief(model: TrainedModel | None) -> dict[str, Any] | None:
    """What pages and the API show of a model: name, algorithm, scores, dates."""
    if model is None:
        return None
    keep = ("n", "mse", "r2", "mae")
    return {
        "id": model.pk,
        "name": model.name,
        "algorithm": model.algorithm,
        "active": model.active,
        "dataset_hash": model.dataset_hash,
        "created_at": model.created_at,
        "live_samples": model.live_samples,
        "scores": {
            v: {k: s.get(k) for k in keep if k in s} for v, s in (model.scores or {}).items()
        },
    }


# -- heatmap ----------------------------------------------------------------------------------


def cluster_gpu_models() -> list[str]:
    """GPU models of the registered GPUs, most common first (catalogue names)."""
    from portal.core.adapters import _gpu_model_key

    counts = Counter(_gpu_model_key(m) for m in Gpu.objects.values_list("model", flat=True))
    return [m for m, _ in counts.most_common()]


def heatmap_profiles(
    *,
    include: ApplicationProfile | None = None,
    limit: int = HEATMAP_MAX_PROFILES,
    visible: set[int] | None = None,
) -> list[ApplicationProfile]:
    """The profiles present: those of queued and placed jobs, then those of measured co-runs,
    most jobs first, among ``visible`` ids if given; ``include`` is always in."""
    states = [JobState.PENDING.value, *(s.value for s in PLACED)]
    counts: Counter[int] = Counter(
        dict(
            Job.objects.filter(state__in=states, profile__isnull=False)
            .values_list("profile")
            .annotate(n=Count("id"))
            .values_list("profile", "n")
        )
    )
    for a, b in CoRunSample.objects.values_list("profile_a", "profile_b"):
        counts.setdefault(a, 0)
        counts.setdefault(b, 0)
    ids = [pk for pk, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    if visible is not None:
        ids = [pk for pk in ids if pk in visible]
    if include is not None and include.pk not in ids:
        ids.insert(0, include.pk)
    ids = ids[:limit]
    if include is not None and include.pk not in ids:
        ids[-1] = include.pk
    rows = ApplicationProfile.objects.prefetch_related("gpu_times", "memory_steps").in_bulk(ids)
    return [rows[pk] for pk in ids if pk in rows]


def _gpu_spec(gpu_model: str) -> Any:
    from portal.core.adapters import gpu_spec_of
    from scheduler.catalog import gpu_spec
    from scheduler.domain import GpuSpec

    row = next(
        (g for g in Gpu.objects.order_by("id").iterator() if _same_model(g.model, gpu_model)),
        None,
    )
    if row is not None:
        return gpu_spec_of(row)
    try:
        return gpu_spec(gpu_model)
    except Exception:  # an unknown model: no figures, the model sees NaN-free zeros
        return GpuSpec(gpu_model, "", 0, 0, 0.0, 0.0)


def _same_model(a: str, b: str) -> bool:
    from portal.core.adapters import _gpu_model_key

    return _gpu_model_key(a) == _gpu_model_key(b)


def interference_heatmap(
    profiles: Sequence[ApplicationProfile], gpu_model: str | None = None
) -> dict[str, Any]:
    """Predicted (active model) and measured (live co-runs) slowdown of every ordered pair of
    ``profiles`` on ``gpu_model`` (default: the cluster's most common GPU model).

    ``predicted[i][j]``: predicted concurrent slowdown of profile i next to profile j (None
    without an active model, or when the model predicts the pair cannot co-run:
    ``predicted_feasible`` False); ``measured[i][j]``: mean measured slowdown over the live
    samples of that ordered pair on that GPU model (None without one); ``samples[i][j]``.
    """
    from portal.core.adapters import profile_to_domain
    from scheduler.learning.runtime import active_predictor

    models_present = cluster_gpu_models()
    gpu_model = gpu_model or (models_present[0] if models_present else DEFAULT_GPU_MODEL)
    model = active_model()
    predictor = active_predictor() if model is not None else None
    spec = _gpu_spec(gpu_model)
    domain = [profile_to_domain(p) for p in profiles]
    ids = [p.pk for p in profiles]
    n = len(profiles)
    predicted: list[list[float | None]] = [[None] * n for _ in range(n)]
    feasible: list[list[bool | None]] = [[None] * n for _ in range(n)]
    if predictor is not None and n:
        from scheduler.learning.features import gpu_vector

        g = gpu_vector(spec)
        vectors = [predictor.job_vector(d) for d in domain]
        results = predictor.predict(
            [(vectors[i], vectors[j], g) for i in range(n) for j in range(n)]
        )
        for k, (norm, p_ok) in enumerate(results):
            i, j = divmod(k, n)
            feasible[i][j] = p_ok >= 0.5
            if p_ok >= 0.5:
                predicted[i][j] = round(1.0 / max(0.05, min(1.0, norm)), 4)
    measured: list[list[float | None]] = [[None] * n for _ in range(n)]
    counts: list[list[int]] = [[0] * n for _ in range(n)]
    index = {pk: i for i, pk in enumerate(ids)}
    rows = (
        CoRunSample.objects.filter(profile_a__in=ids, profile_b__in=ids)
        .values("profile_a", "profile_b", "gpu_model")
        .annotate(avg=Avg("slowdown"), n=Count("id"))
    )
    for row in rows:
        if not _same_model(row["gpu_model"], gpu_model):
            continue
        i, j = index[row["profile_a"]], index[row["profile_b"]]
        total = counts[i][j] + row["n"]
        prev = measured[i][j] or 0.0
        measured[i][j] = round((prev * counts[i][j] + row["avg"] * row["n"]) / total, 4)
        counts[i][j] = total
    cells = [
        {
            "row": ids[i],
            "col": ids[j],
            "predicted": predicted[i][j],
            "predicted_feasible": feasible[i][j],
            "measured": measured[i][j],
            "samples": counts[i][j],
        }
        for i in range(n)
        for j in range(n)
    ]
    errors = [
        abs(predicted[i][j] - measured[i][j])  # type: ignore[operator]
        for i in range(n)
        for j in range(n)
        if predicted[i][j] is not None and measured[i][j] is not None
    ]
    return {
        "model": model_brief(model),
        "gpu_model": gpu_model,
        "gpu_models": models_present or [gpu_model],
        "profiles": [{"id": p.pk, "name": p.name, "version": p.version} for p in profiles],
        "labels": [p.name for p in profiles],
        "predicted": predicted,
        "predicted_feasible": feasible,
        "measured": measured,
        "samples": counts,
        "cells": cells,
        "measured_pairs": len(errors),
        "mean_abs_error": round(sum(errors) / len(errors), 4) if errors else None,
        "note": _note(model, n, len(errors)),
    }


def _note(model: TrainedModel | None, n: int, compared: int) -> str:
    parts = [
        "Slowdown of the row's job next to the column's (co-run / solo time; 1.0 = no "
        "interference), on one GPU model."
    ]
    if model is None:
        parts.append(
            "No interference model is active: train one (manage.py train_interference) and "
            "activate it in the admin to see predictions."
        )
    if n < 2:
        parts.append("Fewer than two profiles are present (queued or placed jobs).")
    if compared:
        parts.append(f"{compared} pair(s) have both a prediction and a measurement.")
    else:
        parts.append(
            "No measured co-run of these profiles yet (live samples of two jobs alone on a GPU)."
        )
    return " ".join(parts)
