"""What-if replay (docs/replay.md): create a replay, and run it (the Celery task's one call).

``replay_run_execute`` exports the period (``portal.replay.export``), reads the export back
through the simulator's own readers (exactly what ``python -m scheduler.simulate`` reads), runs
the simulator once per policy with the progress written to the row as it goes, and stores the
comparison: the simulator's summary per policy, a "live (as it ran)" row from the jobs' own
times, per-user figures and the user fairness, plus the simulator's summary.csv, jobs.csv and
report.html in the run's directory.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import statistics
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from portal.celery import app
from portal.replay.export import (
    HistoryExport,
    history_export,
    history_export_write,
)
from portal.replay.models import ReplayRun

log = logging.getLogger(__name__)

LIVE_ROW = "live (as it ran)"
# The Celery task's time limit (s): a replay RUNNING for longer lost its worker.
TASK_TIME_LIMIT_S = 3600
# The Celery task that runs a replay (portal.replay.tasks), enqueued by this name.
REPLAY_RUN_TASK = "cosched.replay_run"
MAX_POLICIES = 8
SAVED_PREFIX = "saved:"
# The row's progress is written at most this often (s) while the simulator runs.
PROGRESS_EVERY_S = 0.5
# Share of the progress bar each phase takes: export, simulations, outputs.
_EXPORT_SHARE, _SIMULATE_SHARE = 0.05, 0.9


def replay_dir(run_id: int) -> Path:
    """Where a replay's export and outputs go (under ``COSCHED_DATA_DIR``)."""
    return Path(settings.DATA_DIR) / "replay" / str(int(run_id))


def policy_choices() -> list[tuple[str, str]]:
    """(value, label) of what a replay can run: every registered policy with its default
    parameters, and every saved policy configuration (``PolicySettings``: the live loop's
    named configurations, ``saved:<name>``) with its own parameters."""
    from portal.core.models import PolicySettings
    from scheduler.policies.registry import available_policies

    saved = [
        (
            f"{SAVED_PREFIX}{row.name}",
            f"{row.name}: {row.policy} with its saved settings"
            + (" (active)" if row.active else ""),
        )
        for row in PolicySettings.objects.order_by("name")
    ]
    return saved + [(name, name) for name in available_policies()]


def _built(choice: str) -> tuple[str, Any]:
    """(label, policy) of a replay's policy choice (``policy_choices``)."""
    from portal.core.models import PolicySettings
    from scheduler.policies.registry import build_policy

    if not choice.startswith(SAVED_PREFIX):
        return choice, build_policy(choice, None)
    name = choice.removeprefix(SAVED_PREFIX)
    row = PolicySettings.objects.filter(name=name).first()
    if row is None:
        raise ValueError(f"the saved policy settings {name!r} no longer exist")
    params = dict(row.params or {})
    params.pop("seed", None)  # the live loop's seed; the replay has its own
    return f"{row.name}: {row.policy}", build_policy(row.policy, params)


def interference_choices() -> list[str]:
    from scheduler.interference import INTERFERENCE_MODELS

    return sorted(INTERFERENCE_MODELS)


def replay_run_create(
    *,
    user: Any,
    since: datetime,
    until: datetime,
    policies: Sequence[str],
    interference: str = "class_based",
    seed: int = 0,
) -> ReplayRun:
    """Validate and queue a replay; the Celery task starts after the row is committed.

    Raises ``ValidationError`` with one message per bad field (nothing is written then).
    """
    errors: dict[str, str] = {}
    if since >= until:
        errors["until"] = "must be after the start of the period"
    known = {value for value, _label in policy_choices()}
    chosen = list(dict.fromkeys(policies))
    if not chosen:
        errors["policies"] = "choose at least one policy"
    elif len(chosen) > MAX_POLICIES:
        errors["policies"] = f"at most {MAX_POLICIES} policies per replay"
    elif unknown := [p for p in chosen if p not in known]:
        errors["policies"] = (
            f"unknown policy {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    if interference not in interference_choices():
        errors["interference"] = f"unknown model; known: {', '.join(interference_choices())}"
    if errors:
        raise ValidationError(errors)
    run = ReplayRun.objects.create(
        created_by=user,
        since=since,
        until=until,
        policies=chosen,
        interference=interference,
        seed=seed,
    )

    def enqueue() -> None:
        app.tasks[REPLAY_RUN_TASK].delay(run.pk)  # portal.replay.tasks.replay_run

    transaction.on_commit(enqueue)
    return run


def replay_run_delete(run: ReplayRun) -> None:
    """Delete a replay that is not running, and its directory (export, outputs).

    Raises ``ValidationError`` for a queued or running replay (its task would write again)."""
    if run.status in (ReplayRun.Status.QUEUED, ReplayRun.Status.RUNNING):
        raise ValidationError("a queued or running replay cannot be deleted; wait for it to end")
    folder = replay_dir(run.pk)
    run.delete()
    if folder.is_dir():
        shutil.rmtree(folder)


def _set(run_id: int, **fields: Any) -> None:
    ReplayRun.objects.filter(pk=run_id).update(**fields)


def replay_run_execute(run_id: int) -> ReplayRun:
    """Run replay ``run_id`` if it is still queued (a duplicate delivery does nothing), or
    running for longer than the task's time limit (its worker died; the broker redelivered)."""
    stale = timezone.now() - timedelta(seconds=TASK_TIME_LIMIT_S)
    claimable = Q(status=ReplayRun.Status.QUEUED) | Q(
        status=ReplayRun.Status.RUNNING, started_at__lt=stale
    )
    claimed = ReplayRun.objects.filter(claimable, pk=run_id).update(
        status=ReplayRun.Status.RUNNING,
        started_at=timezone.now(),
        progress=0.0,
        message="exporting the period's jobs",
    )
    run = ReplayRun.objects.get(pk=run_id)
    if not claimed:
        return run
    try:
        _execute(run)
    except Exception as exc:
        log.exception("replay %s failed", run_id)
        _set(
            run_id,
            status=ReplayRun.Status.FAILED,
            finished_at=timezone.now(),
            error=f"{type(exc).__name__}: {exc}"[:5000],
            message="failed",
        )
    run.refresh_from_db()
    return run


def _execute(run: ReplayRun) -> None:
    from scheduler.cluster_spec import load_cluster_spec
    from scheduler.traces import read_profile_trace

    export = history_export(run.since, run.until)
    out = replay_dir(run.pk)
    paths = history_export_write(export, out)
    _set(
        run.pk,
        jobs_exported=len(export.jobs),
        left_out=export.left_out,
        out_dir=str(out),
        progress=_EXPORT_SHARE,
        message=f"exported {len(export.jobs)} jobs",
    )
    if not export.jobs:
        raise ValueError("no completed job was submitted in the period: nothing to replay")
    # Read back through the simulator's readers: the replay sees what the CLI would see.
    cluster = load_cluster_spec(paths["cluster"])
    jobs = read_profile_trace(paths["trace"], paths["profiles"])
    _set(run.pk, cluster=cluster.describe()[:300])
    results = _simulate(run, cluster, jobs)
    _set(run.pk, progress=_EXPORT_SHARE + _SIMULATE_SHARE, message="writing the report")
    summary, per_user, per_project = _comparison(results, export)
    from scheduler.simulate import write_outputs

    write_outputs(
        out,
        results,
        summary,
        title=f"What-if replay {run.pk}: {run.since:%Y-%m-%d %H:%M} to {run.until:%Y-%m-%d %H:%M}",
        notes=f"{len(jobs)} jobs of the portal's history; {cluster.describe()}; "
        f"interference {run.interference}; seed {run.seed}",
    )
    rows = _records(summary)
    rows.insert(0, _live_row(export))
    _set(
        run.pk,
        status=ReplayRun.Status.DONE,
        progress=1.0,
        message="done",
        finished_at=timezone.now(),
        summary=rows,
        per_user=_records(per_user),
        per_project=_records(per_project),
    )


def _simulate(run: ReplayRun, cluster: Any, jobs: list[Any]) -> list[Any]:
    from scheduler.interference import build_interference
    from scheduler.simulator import simulate
    from scheduler.simulator.results import SimConfig

    model = None if run.interference == "none" else build_interference(run.interference)
    config = SimConfig(seed=run.seed)
    count = len(run.policies)
    results = []
    built = [_built(choice) for choice in run.policies]  # fail before the first simulation
    for i, (name, policy) in enumerate(built):
        last = [0.0]

        def on_end(done: int, total: int, i: int = i, name: str = name, last=last) -> None:
            now = time.monotonic()
            if now - last[0] < PROGRESS_EVERY_S and done < total:
                return
            last[0] = now
            share = (i + done / max(1, total)) / count
            _set(
                run.pk,
                progress=_EXPORT_SHARE + _SIMULATE_SHARE * share,
                message=f"{name} ({i + 1} of {count}): {done} of {total} jobs ended",
            )

        _set(run.pk, message=f"{name} ({i + 1} of {count}): starting")
        result = simulate(
            cluster, jobs, policy, interference=model, config=config, on_job_end=on_end
        )
        result.policy = name  # a saved configuration is told apart from the defaults
        results.append(result)
    return results


def _comparison(results: list[Any], export: HistoryExport) -> tuple[Any, Any, Any]:
    """The simulator's summary (plus ``user_fairness`` and ``project_fairness``), the
    per-user table and the per-project table."""
    import pandas as pd

    from scheduler.group_metrics import group_fairness, group_summary
    from scheduler.simulate import summary_frame

    summary = summary_frame(results)
    frames = [r.jobs_frame() for r in results]
    per_user = group_summary(pd.concat(frames, ignore_index=True), export.owners)
    fairness = group_fairness(per_user)
    summary["user_fairness"] = [fairness.get(str(p), float("nan")) for p in summary["policy"]]
    per_project = group_summary(pd.concat(frames, ignore_index=True), export.projects)
    by_project = group_fairness(per_project)
    summary["project_fairness"] = [by_project.get(str(p), float("nan")) for p in summary["policy"]]
    return summary, per_user, per_project


def _live_row(export: HistoryExport) -> dict[str, Any]:
    """The period as it really ran: mean JCT, queueing delay and Slow-Down (run time / the
    profile's solo time on the model it ran on) of the exported jobs, from their own times."""
    live = export.live
    slowdowns = [r.run_s / r.solo_s for r in live if r.solo_s and r.run_s > 0]
    return {
        "policy": LIVE_ROW,
        "status": "as it ran",
        "jobs": len(export.jobs),
        "completed": len(export.jobs),
        "avg_jct_s": statistics.fmean(r.jct_s for r in live) if live else None,
        "avg_queue_s": statistics.fmean(r.queue_s for r in live) if live else None,
        "avg_slowdown": statistics.fmean(slowdowns) if slowdowns else None,
        "max_slowdown": max(slowdowns) if slowdowns else None,
    }


def _records(frame: Any) -> list[dict[str, Any]]:
    """A data frame as JSON-safe rows (NaN -> None)."""
    rows = json.loads(frame.to_json(orient="records"))
    for row in rows:
        for key, value in row.items():
            if isinstance(value, float) and not math.isfinite(value):
                row[key] = None
    return rows
