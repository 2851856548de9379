"""Browser pages of job control (docs/job-control.md): hold, release, requeue, pause and resume
buttons, the edit page of a pending job and the page listing an array's tasks."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from portal.core import selectors, services
from portal.core.states import IllegalTransition
from portal.front.forms import JobEditForm
from portal.teams.selectors import can_control_job

#: verb -> (service call, what the job must be, what was done)
_VERBS = {
    "hold": (lambda job, actor: services.job_hold(job, actor=actor), "PENDING", "held"),
    "release": (lambda job, actor: services.job_release(job, actor=actor), "held", "released"),
    "requeue": (
        lambda job, actor: services.job_requeue(job, actor=actor),
        "SCHEDULED, RUNNING or PAUSED",
        "requeued",
    ),
    "pause": (
        lambda job, actor: services.job_pause(
            job, actor=actor, message=f"paused by {actor}", by_user=True
        ),
        "RUNNING",
        "paused (until you resume it)",
    ),
    "resume": (
        lambda job, actor: services.job_resume(job, actor=actor, message=f"resumed by {actor}"),
        "PAUSED",
        "resumed",
    ),
}


def _actor(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


@login_required
@require_POST
def job_control_view(request: HttpRequest, job_id: int, verb: str) -> HttpResponse:
    if verb not in _VERBS:
        raise Http404(f"no action {verb!r}")
    job = selectors.job_for_user(request.user, job_id)
    if not can_control_job(request.user, job):
        messages.error(
            request, f"Only the owner of job #{job.pk} or a project manager can {verb} it."
        )
        return redirect("job_detail", job_id=job.pk)
    service, needed, done = _VERBS[verb]
    try:
        service(job, _actor(request))
    except IllegalTransition as exc:
        messages.error(
            request, f"Job #{job.pk} is {exc.current}: only a {needed} job can be {verb}d."
        )
    else:
        messages.success(request, f"Job #{job.pk} {done}.")
    return redirect("job_detail", job_id=job.pk)


@login_required
def job_edit(request: HttpRequest, job_id: int) -> HttpResponse:
    job = selectors.job_for_user(request.user, job_id)
    if not can_control_job(request.user, job) or job.state != "PENDING":
        messages.error(
            request, f"Job #{job.pk} is {job.state}: only a pending job of yours can be changed."
        )
        return redirect("job_detail", job_id=job.pk)
    if request.method != "POST":
        form = JobEditForm(initial=JobEditForm.initial_of(job))
        return render(request, "front/job_edit.html", {"job": job, "form": form})
    form = JobEditForm(request.POST)
    if form.is_valid():
        try:
            services.job_update(job, actor=_actor(request), owner=job.owner, **form.changes())
        except IllegalTransition as exc:
            form.add_error(
                None, f"Job #{job.pk} is {exc.current} now: it can no longer be changed."
            )
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                field = "time_limit" if field == "time_limit_s" else field
                form.add_error(field if field in form.fields else None, errors)
        else:
            messages.success(request, f"Job #{job.pk} changed.")
            return redirect("job_detail", job_id=job.pk)
    return render(request, "front/job_edit.html", {"job": job, "form": form}, status=400)


@login_required
def job_array(request: HttpRequest, array_id: int) -> HttpResponse:
    first = selectors.job_for_user(request.user, array_id)
    if first.array_of_id != first.pk:
        raise Http404(f"job {array_id} is not the first task of an array")
    tasks = list(
        selectors.jobs_visible_to(request.user)
        .filter(array_of_id=first.pk)
        .order_by("array_index", "id")
    )
    counts: dict[str, int] = {}
    for task in tasks:
        counts[task.state] = counts.get(task.state, 0) + 1
    return render(
        request,
        "front/job_array.html",
        {"first": first, "tasks": tasks, "counts": sorted(counts.items())},
    )
