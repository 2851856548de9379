"""Browser pages: short views over the services (writes) and private query helpers (reads)."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Page, Paginator
from django.db.models import Count, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from portal.core import node_ops, selectors, validation
from portal.core.models import Gpu, Job, Node, PolicySettings
from portal.core.node_ops import node_state_label
from portal.core.policy_settings import validate_policy_settings
from portal.core.profiling import profiling_jobs, profiling_submit
from portal.core.services import IdempotencyConflict, job_cancel, job_preempt, job_submit
from portal.core.states import PLACED, IllegalTransition, JobState
from portal.front import profile_metrics
from portal.front.forms import JobFilterForm, JobSubmitForm, ProfileFilterForm, TokenCreateForm
from portal.front.models import ApiToken
from portal.front.services import token_create, token_revoke
from portal.teams.accounting import fair_share_of
from portal.teams.selectors import can_control_job

JOBS_PER_PAGE = 25
QUEUE_ROWS = 50
# The cluster page's plot time ranges: key -> (label, seconds).
TIME_RANGES = {
    "15m": ("15 min", 900),
    "1h": ("1 hour", 3600),
    "6h": ("6 hours", 6 * 3600),
    "24h": ("24 hours", 24 * 3600),
    "7d": ("7 days", 7 * 24 * 3600),
}
PROFILES_PER_PAGE = 25


# -- private helpers (reads go through portal.core.selectors) --------------------------------


def _page(request: HttpRequest, items: QuerySet, per_page: int) -> Page:
    return Paginator(items, per_page).get_page(request.GET.get("page"))


def _admin_url(name: str, *args: object) -> str | None:
    """An admin URL, or None while that model is not registered in the admin."""
    try:
        return reverse(f"admin:{name}", args=args)
    except NoReverseMatch:
        return None


def _actor(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


# -- jobs -------------------------------------------------------------------------------------


@login_required
def index(request: HttpRequest) -> HttpResponse:
    return redirect("jobs")


@login_required
def jobs(request: HttpRequest) -> HttpResponse:
    form = JobFilterForm(request.GET)
    form.is_valid()
    state, query = form.cleaned_data.get("state"), form.cleaned_data.get("q")
    visible = selectors.jobs_visible_to(request.user)
    if query:
        match = Q(name__icontains=query)
        if request.user.is_staff:
            match |= Q(owner__username__icontains=query)
        visible = visible.filter(match)
    counts = dict(visible.values_list("state").annotate(n=Count("id")).order_by())
    listed = visible.filter(state=state) if state else visible
    tabs = [("", "All", sum(counts.values()))] + [
        (s.value, s.value.title(), counts.get(s.value, 0)) for s in JobState
    ]
    return render(
        request,
        "front/jobs.html",
        {
            "page": _page(request, listed, JOBS_PER_PAGE),
            "form": form,
            "state": state,
            "query": query,
            "tabs": tabs,
            "any_jobs": selectors.jobs_visible_to(request.user).exists(),
            # Staff, and members of a project whose other members' jobs are listed
            "show_owner": request.user.is_staff or visible.exclude(owner=request.user).exists(),
        },
    )


@login_required
def job_new(request: HttpRequest) -> HttpResponse:
    user = request.user
    if request.method != "POST":
        form = JobSubmitForm(user=user)
        if request.GET.get("profile"):  # "Submit a job with it" from a profile page
            filled = JobSubmitForm(request.GET).filled_from_profile().dict()
            form = JobSubmitForm(initial=filled, user=user)
        return render(request, "front/job_new.html", {"form": form})
    if "prefill" in request.POST:  # "Fill in from profile" without JavaScript
        filled = JobSubmitForm(request.POST).filled_from_profile().dict()
        form = JobSubmitForm(initial=filled, user=user)
        return render(request, "front/job_new.html", {"form": form})
    form = JobSubmitForm(request.POST, user=user)
    if form.is_valid():
        token = form.cleaned_data["submit_token"]
        try:
            job, created = job_submit(
                request.user,
                idempotency_key=f"web:{token}" if token else None,
                **form.job_fields(),
            )
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        except IdempotencyConflict as exc:
            form.add_error(None, f"This form was already submitted as job #{exc.job.pk}.")
        else:
            if created:
                note = f" Note: {job.waiting_reason}." if job.waiting_reason else ""
                messages.success(request, f"Job #{job.pk} submitted; it is {job.state}.{note}")
            else:
                messages.info(request, f"This form was already submitted as job #{job.pk}.")
            if job.array_of_id is not None:
                return redirect("job_array", array_id=job.array_of_id)
            return redirect("job_detail", job_id=job.pk)
    return render(request, "front/job_new.html", {"form": form}, status=400)


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = selectors.job_for_user(request.user, job_id)
    placements = list(job.placements.select_related("node").prefetch_related("gpus"))
    return render(
        request,
        "front/job_detail.html",
        {
            "job": job,
            "events": selectors.job_events(job),
            "placement": next((p for p in placements if p.active), None),
            "past_placements": [p for p in placements if not p.active],
            "attempts": selectors.job_attempts(job),
            "elastic_changes": list(job.elastic_changes.all()),
            "ratio_changes": list(job.ratio_changes.all()),
            "can_cancel": not job.is_terminal and can_control_job(request.user, job),
            "can_control": can_control_job(request.user, job),
            "can_preempt": request.user.is_staff and job.state in PLACED,
            "admin_url": _admin_url("core_job_change", job.pk) if request.user.is_staff else None,
        },
    )


@login_required
@require_POST
def job_cancel_view(request: HttpRequest, job_id: int) -> HttpResponse:
    job = selectors.job_for_user(request.user, job_id)
    if not can_control_job(request.user, job):
        messages.error(
            request, f"Only the owner of job #{job.pk} or a project manager can cancel it."
        )
        return redirect("job_detail", job_id=job.pk)
    try:
        job_cancel(job, actor=_actor(request), message="cancelled from the portal")
    except IllegalTransition as exc:
        messages.error(request, f"Job #{job.pk} is already {exc.current}; nothing to cancel.")
    else:
        messages.success(request, f"Job #{job.pk} cancelled.")
    return redirect("job_detail", job_id=job.pk)


@login_required
@require_POST
def job_preempt_view(request: HttpRequest, job_id: int) -> HttpResponse:
    if not request.user.is_staff:
        raise PermissionDenied("only staff can preempt jobs")
    job = selectors.job_for_user(request.user, job_id)
    reason = " ".join(request.POST.get("reason", "").split())[:500]
    if validation.text_error(reason):
        reason = ""
    try:
        job_preempt(job, actor=_actor(request), reason=reason or f"preempted by {_actor(request)}")
    except IllegalTransition as exc:
        messages.error(request, f"Job #{job.pk} is {exc.current}; only a placed job is preempted.")
    else:
        messages.success(request, f"Job #{job.pk} preempted: it is back in the queue.")
    return redirect("job_detail", job_id=job.pk)


# -- profiles ---------------------------------------------------------------------------------


@login_required
def profiles(request: HttpRequest) -> HttpResponse:
    form = ProfileFilterForm(request.GET)
    form.is_valid()
    listed = selectors.profiles_visible_to(
        request.user, kind=form.cleaned_data.get("kind"), status=form.cleaned_data.get("status")
    )
    if query := form.cleaned_data.get("q"):
        listed = listed.filter(
            Q(name__icontains=query) | Q(description__icontains=query) | Q(dataset__icontains=query)
        )
    return render(
        request,
        "front/profiles.html",
        {
            "page": _page(request, listed, PROFILES_PER_PAGE),
            "form": form,
            "filtered": any(form.cleaned_data.values()),
            "admin_url": (
                _admin_url("core_applicationprofile_changelist") if request.user.is_staff else None
            ),
        },
    )


@login_required
def profile_detail(request: HttpRequest, profile_id: int) -> HttpResponse:
    profile = selectors.profile_for_user(request.user, profile_id)
    return render(
        request,
        "front/profile_detail.html",
        {
            "profile": profile,
            "sections": profile_metrics.sections(profile),
            "gpu_times": profile_metrics.gpu_time_rows(profile),
            "sources": profile_metrics.source_rows(profile),
            "memory_steps": profile.memory_steps.all(),
            "classes": profile_metrics.derived_classes(profile),
            "admin_url": (
                _admin_url("core_applicationprofile_change", profile.pk)
                if request.user.is_staff
                else None
            ),
            "profiling_jobs": profiling_jobs(profile)[:20] if request.user.is_staff else [],
            "gpu_models": (
                sorted(set(Gpu.objects.values_list("model", flat=True)))
                if request.user.is_staff
                else []
            ),
        },
    )


@login_required
@require_POST
def profile_profiling(request: HttpRequest, profile_id: int) -> HttpResponse:
    """Staff: start a profiling run of this profile (portal.core.profiling)."""
    if not request.user.is_staff:
        raise PermissionDenied("staff only")
    profile = selectors.profile_for_user(request.user, profile_id)
    models = [m for m in request.POST.getlist("models") if m]
    other_id = request.POST.get("with_profile") or ""
    other = None
    if other_id.isdigit():
        other = selectors.profile_for_user(request.user, int(other_id))
    try:
        run, jobs = profiling_submit(request.user, profile, models=models, with_profile=other)
    except ValidationError as exc:
        for field, errors in exc.message_dict.items():
            messages.error(request, f"{field}: {'; '.join(errors)}")
    else:
        messages.success(request, f"Profiling run {run}: {len(jobs)} jobs submitted.")
    return redirect("profile_detail", profile_id=profile.pk)


# -- cluster ----------------------------------------------------------------------------------


@login_required
def cluster(request: HttpRequest) -> HttpResponse:
    from portal.api.dashboard import BACKEND_LABELS, overview_nodes

    nodes = list(selectors.nodes_with_gpus())
    live = {n["id"]: n for n in overview_nodes(nodes, request.user, timezone.now())}
    for node in nodes:  # the live view rides on the rows the template already walks
        node.live = live[node.pk]
        node.state_label = node_state_label(node, running=node.live.get("job_count"))
        live_gpus = {g["id"]: g for g in node.live["gpus"]}
        for gpu in node.gpus.all():
            gpu.live = live_gpus.get(gpu.pk)
    counts = dict(
        Job.objects.filter(state__in=[JobState.PENDING, JobState.RUNNING])
        .order_by()
        .values_list("state")
        .annotate(n=Count("id"))
    )
    range_key = request.GET.get("range") if request.GET.get("range") in TIME_RANGES else "1h"
    active = PolicySettings.objects.filter(active=True).first()
    policy_errors = (
        validate_policy_settings(active.policy, active.params, trial=False) if active else {}
    )
    queue, queue_total = selectors.queue_for(request.user, limit=QUEUE_ROWS)
    return render(
        request,
        "front/cluster.html",
        {
            "queue": queue,
            "queue_total": queue_total,
            "active_policy": active,
            "policy_errors": policy_errors,
            "ranges": [(key, label) for key, (label, _s) in TIME_RANGES.items()],
            "range_key": range_key,
            "window_s": TIME_RANGES[range_key][1],
            "nodes": nodes,
            "gpu_count": sum(len(node.gpus.all()) for node in nodes),
            "backends": sorted(
                {BACKEND_LABELS.get(n.backend, n.backend) for n in nodes if n.kind == "gpu"}
            ),
            "nodes_down": [n for n in nodes if n.status == Node.Status.DOWN],
            "queue_length": counts.get(JobState.PENDING, 0),
            "running_jobs": counts.get(JobState.RUNNING, 0),
        },
    )


@login_required
@require_POST
def node_operate_view(request: HttpRequest, node_id: int, op: str) -> HttpResponse:
    """Drain, take down or resume a node from the cluster page (staff)."""
    if not request.user.is_staff:
        raise PermissionDenied("only staff can drain, take down or resume nodes")
    if op not in node_ops.ACTIONS:
        raise Http404(f"no node operation {op!r}")
    node = get_object_or_404(Node, pk=node_id)
    reason = " ".join(request.POST.get("reason", "").split())
    actor = _actor(request)
    try:
        if op == "drain":
            node_ops.node_drain(node, actor=actor, reason=reason)
            messages.success(request, f"Node {node.name} drains: its jobs finish, none start.")
        elif op == "down":
            _, requeued = node_ops.node_down(node, actor=actor, reason=reason)
            messages.success(
                request, f"Node {node.name} is down: {len(requeued)} job(s) back in the queue."
            )
        else:
            node_ops.node_resume(node, actor=actor)
            messages.success(request, f"Node {node.name} is back in service.")
    except node_ops.NodeOpError as exc:
        messages.error(request, f"Node {node.name}: {exc}")
    return redirect(f"{reverse('cluster')}#node-{node.pk}")


def _staff_only(request: HttpRequest, what: str) -> None:
    if not request.user.is_staff:
        raise PermissionDenied(f"only staff can {what}")


@login_required
def node_tokens(request: HttpRequest) -> HttpResponse:
    """Node tokens (staff): list, create (the key shown once), revoke."""
    from portal.core.models import NodeToken
    from portal.core.nodes import node_token_create
    from portal.front.forms import NodeTokenCreateForm

    _staff_only(request, "manage node tokens")
    extra: dict[str, object] = {}
    form = NodeTokenCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        token, key = node_token_create(form.cleaned_data["node_name"])
        extra = {"new_token": token, "new_key": key}
        form = NodeTokenCreateForm()
    response = render(
        request,
        "front/node_tokens.html",
        {
            "form": form,
            "tokens": NodeToken.objects.all(),
            "known_nodes": set(Node.objects.values_list("name", flat=True)),
            **extra,
        },
        status=400 if form.errors else 200,
    )
    response["Cache-Control"] = "no-store"  # the page may show a new key once
    return response


@login_required
@require_POST
def node_token_revoke_view(request: HttpRequest, token_id: int) -> HttpResponse:
    from portal.core.models import NodeToken
    from portal.core.nodes import node_token_revoke_one

    _staff_only(request, "manage node tokens")
    token = get_object_or_404(NodeToken, pk=token_id)
    if node_token_revoke_one(token):
        messages.success(
            request,
            f"Token {token.prefix}… of node {token.node_name} revoked: an agent using it can no "
            "longer sync (its node is marked down once the lease runs out).",
        )
    else:
        messages.error(request, f"Token {token.prefix}… was revoked already.")
    return redirect("node_tokens")


# -- account and API tokens -------------------------------------------------------------------


def _account(request: HttpRequest, form: TokenCreateForm, **extra: object) -> HttpResponse:
    response = render(
        request,
        "front/account.html",
        {
            "form": form,
            "tokens": request.user.api_tokens.all(),
            "fair_share": fair_share_of(request.user, timezone.now()),
            "half_life_days": settings.COSCHED["FAIRSHARE_HALF_LIFE_S"] / 86400,
            **extra,
        },
        status=400 if form.errors else 200,
    )
    response["Cache-Control"] = "no-store"  # the page may show a new key once
    return response


@login_required
def account(request: HttpRequest) -> HttpResponse:
    return _account(request, TokenCreateForm())


@login_required
@require_POST
def token_new(request: HttpRequest) -> HttpResponse:
    form = TokenCreateForm(request.POST)
    if form.is_valid():
        try:
            token, key = token_create(request.user, name=form.cleaned_data["name"])
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        else:
            # Rendered, not redirected: the key lives in this one response and nowhere else.
            return _account(request, TokenCreateForm(), new_token=token, new_key=key)
    return _account(request, form)


@login_required
@require_POST
def token_revoke_view(request: HttpRequest, token_id: int) -> HttpResponse:
    token = get_object_or_404(ApiToken, pk=token_id, user=request.user)
    token_revoke(token)
    messages.success(request, f'Token "{token.name}" revoked; it no longer works.')
    return redirect("account")


# -- the documentation site -------------------------------------------------------------------


def docs(request: HttpRequest, path: str = "") -> HttpResponse:
    """The built docs site (``make docs``) at /docs/; a page saying how to build it if it is
    missing. Public, like any manual."""
    from django.conf import settings
    from django.views.static import serve

    root = Path(settings.DOCS_SITE_DIR)
    if not (root / "index.html").is_file():
        return render(request, "front/docs_missing.html", {"docs_dir": root}, status=503)
    if path == "" or path.endswith("/"):
        path += "index.html"
    elif (root / path).is_dir():
        return redirect(request.path + "/")
    return serve(request, path, document_root=str(root))
