"""The staff's what-if replay pages (docs/replay.md): a list with the form, a page per replay
(its progress while it runs, the comparison when done), its status as JSON for the page's
polling, and the files it wrote."""

from __future__ import annotations

from pathlib import Path

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import ValidationError
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from portal.replay.forms import ReplayForm
from portal.replay.models import ReplayRun
from portal.replay.services import LIVE_ROW, replay_run_create, replay_run_delete

# Files of a replay's directory the page links to: name -> content type.
FILES = {
    "report.html": "text/html",
    "summary.csv": "text/csv",
    "jobs.csv": "text/csv",
    "trace.csv": "text/csv",
    "profiles.yaml": "text/plain",
    "cluster.yaml": "text/plain",
}
# Comparison columns shown on the page: key -> (heading, decimals).
COLUMNS = {
    "completed": ("completed", 0),
    "avg_jct_s": ("avg JCT (s)", 1),
    "avg_queue_s": ("avg wait (s)", 1),
    "makespan_s": ("makespan (s)", 0),
    "gpu_util": ("GPU util", 3),
    "avg_slowdown": ("avg Slow-Down", 2),
    "max_slowdown": ("max Slow-Down", 2),
    "fairness": ("job fairness", 2),
    "user_fairness": ("user fairness", 2),
    "project_fairness": ("project fairness", 2),
}


def _shown(value: object, digits: int) -> str:
    """A figure as the table shows it: a dash when unknown (an incomplete run's averages)."""
    if value is None:
        return "–"
    if isinstance(value, int | float):
        return f"{value:,.{digits}f}"
    return str(value)


@staff_member_required
def replay_list(request: HttpRequest) -> HttpResponse:
    status = 200
    if request.method == "POST":
        form = ReplayForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            try:
                run = replay_run_create(
                    user=request.user,
                    since=data["since"],
                    until=data["until"],
                    policies=data["policies"],
                    interference=data["interference"],
                    seed=data["seed"],
                )
            except ValidationError as exc:
                for field, errors in exc.message_dict.items():
                    for error in errors:
                        form.add_error(field if field in form.fields else None, error)
            else:
                return redirect("replay_detail", run_id=run.pk)
        status = 400
    else:
        form = ReplayForm()
    runs = ReplayRun.objects.select_related("created_by")[:50]
    return render(request, "replay/list.html", {"form": form, "runs": runs}, status=status)


@staff_member_required
def replay_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(ReplayRun, pk=run_id)
    rows = [
        {
            "policy": row.get("policy"),
            "status": row.get("status"),
            "live": row.get("policy") == LIVE_ROW,
            "cells": [_shown(row.get(key), digits) for key, (_h, digits) in COLUMNS.items()],
        }
        for row in run.summary
    ]
    files = [name for name in FILES if run.out_dir and (Path(run.out_dir) / name).exists()]
    live_sd = next(
        (r.get("avg_slowdown") for r in run.summary if r.get("policy") == LIVE_ROW), None
    )
    # Live runs far from their profiles' times (the demo's DEMO_SCALE, stale profiles): the
    # simulated rows use the profiles, so only the policies compare with each other then.
    mismatch = None
    if live_sd and not 0.5 <= live_sd <= 2.0:
        mismatch = (
            f"{1 / live_sd:.1f} times faster" if live_sd < 1 else f"{live_sd:.1f} times slower"
        )
    return render(
        request,
        "replay/detail.html",
        {
            "run": run,
            "columns": [heading for heading, _d in COLUMNS.values()],
            "rows": rows,
            "per_user": run.per_user,
            "per_project": run.per_project,
            "files": files,
            "mismatch": mismatch,
            "running": run.status in (ReplayRun.Status.QUEUED, ReplayRun.Status.RUNNING),
        },
    )


@require_POST
@staff_member_required
def replay_delete(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(ReplayRun, pk=run_id)
    try:
        replay_run_delete(run)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("replay_detail", run_id=run_id)
    messages.success(request, f"Replay {run_id} and its files deleted.")
    return redirect("replay_list")


@staff_member_required
def replay_status(request: HttpRequest, run_id: int) -> JsonResponse:
    run = get_object_or_404(ReplayRun, pk=run_id)
    return JsonResponse(
        {
            "id": run.pk,
            "status": run.status,
            "status_display": run.get_status_display(),
            "progress": run.progress,
            "message": run.message,
            "error": run.error,
        }
    )


@staff_member_required
def replay_file(request: HttpRequest, run_id: int, name: str) -> FileResponse:
    run = get_object_or_404(ReplayRun, pk=run_id)
    if name not in FILES or not run.out_dir:
        raise Http404("no such file")
    path = Path(run.out_dir) / name
    if not path.is_file():
        raise Http404("not written (yet)")
    inline = name == "report.html"
    response = FileResponse(
        path.open("rb"), content_type=FILES[name], as_attachment=not inline, filename=name
    )
    if inline:
        # The report holds user-chosen text (job names): its scripts run in a sandbox with an
        # origin of its own, so nothing in it can act on the portal with the staff's session.
        response["Content-Security-Policy"] = "sandbox allow-scripts"
    return response
