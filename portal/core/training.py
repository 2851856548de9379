"""Training jobs talking to Cosched (the training SDK, ``workers.sdk``): job tokens, reports,
data ratios (``slowdown_dr``, ALGORITHMS.md §5) and their history.

**Job tokens.** Each attempt of a job gets its own token in its environment
(``COSCHED_JOB_TOKEN``): ``cjt_<job>_<attempt>_<HMAC-SHA256(SECRET_KEY, job, attempt)>``.
Nothing is stored: the portal recomputes the MAC. A token is valid while its attempt is the
job's active one and the job runs (RUNNING or PAUSED); a malformed or forged token is refused
with 401, the token of an attempt that ended (or of a job not running) with 403. It opens only
the training endpoint of that job: it is not an API token and carries no user rights. Rotating
``SECRET_KEY`` invalidates every job token.

**Reports** (``training_report``): every call records the job's iteration; at an epoch end it
records SD_i (the job's own value when it sends one, else computed here from its figures and
its profile's solo time), marks the epoch end unanswered and, when the active policy
manages data ratios (``slowdown_dr``), runs the DR manager at once for the jobs of that node
(the same ``SlowdownDrPolicy.ratio_changes`` the scheduling loop and the simulator call), so the
reply already carries the ratio for the next epoch. The reply is a JSON object that later
features extend (the worker count is there for ``elastic``).
"""

from __future__ import annotations

import base64
import hmac
import math
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from portal.core import adapters
from portal.core.models import (
    DataRatioChange,
    Gpu,
    MetricSample,
    Node,
    Placement,
    PolicySettings,
    TrainingState,
)
from portal.core.nodes import locked_nodes
from portal.core.states import JobState
from portal.core.validation import DB_INT_MAX
from scheduler.domain import (
    ClusterState,
    DataParallelState,
    GpuState,
    JobSpec,
    NodeKind,
    NodeState,
    RunningJob,
    SharingMode,
)
from scheduler.domain import Placement as DomainPlacement
from scheduler.policies.base import PolicyError
from scheduler.policies.registry import build_policy
from scheduler.slowdown_dr import RatioError, check_ratio, largest_remainder
from workers.sdk.client import JOB_TOKEN_PREFIX, TOKEN_ENV
from workers.slowdown import live_slowdown

#: GPU utilisation samples older than this do not count for the DR manager.
UTIL_FRESH_S = 60.0
_LIVE = (JobState.RUNNING, JobState.PAUSED)


class TokenError(Exception):
    """A job token that is refused: ``status`` 401 (not a token of ours) or 403 (expired)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ReportError(ValueError):
    """A report with bad fields: ``errors`` maps each bad field to what is wrong."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = dict(errors)


# --- job tokens ----------------------------------------------------------------------------------


def _mac(job_id: int, attempt: int) -> str:
    digest = hmac.new(
        settings.SECRET_KEY.encode(), f"cosched-job-token:{job_id}:{attempt}".encode(), "sha256"
    ).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def job_token(job_id: int, attempt: int) -> str:
    """The token of attempt ``attempt`` of job ``job_id`` (see the module docstring)."""
    return f"{JOB_TOKEN_PREFIX}{job_id}_{attempt}_{_mac(job_id, attempt)}"


def training_env(job_id: int, attempt: int) -> dict[str, str]:
    """What the portal adds to an attempt's environment for the SDK: its job token (the agent
    adds ``COSCHED_API_URL``, the portal URL it syncs with)."""
    return {TOKEN_ENV: job_token(job_id, attempt)}


def job_token_placement(key: str) -> Placement:
    """The running attempt ``key`` is the token of; raises TokenError (401 / 403)."""
    if not key.startswith(JOB_TOKEN_PREFIX):
        raise TokenError(401, "not a job token")
    job_part, _, rest = key[len(JOB_TOKEN_PREFIX) :].partition("_")
    attempt_part, _, mac = rest.partition("_")
    if not (job_part.isdigit() and attempt_part.isdigit() and mac):
        raise TokenError(401, "malformed job token")
    job_id, attempt = int(job_part), int(attempt_part)
    if not hmac.compare_digest(mac, _mac(job_id, attempt)):
        raise TokenError(401, "invalid job token")
    placement = (
        Placement.objects.select_related("job", "node", "job__profile")
        .filter(job_id=job_id, attempt=attempt)
        .first()
    )
    if placement is None or not placement.active or placement.job.state not in _LIVE:
        raise TokenError(403, f"job {job_id} attempt {attempt} is not running: token expired")
    return placement


# --- reports ---------------------------------------------------------------------------------


def _int(data: Mapping[str, Any], key: str, errors: dict[str, str], *, minimum: int = 0) -> Any:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        errors[key] = f"expected an integer, got {value!r}"
        return None
    if not minimum <= value <= DB_INT_MAX:
        errors[key] = f"expected an integer from {minimum} to {DB_INT_MAX:,}, got {value}"
        return None
    return value


def _float(data: Mapping[str, Any], key: str, errors: dict[str, str], *, positive: bool) -> Any:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        errors[key] = f"expected a number, got {value!r}"
        return None
    if value < 0 or (positive and value == 0) or value > 1e9:
        errors[key] = f"expected a {'positive' if positive else 'non-negative'} number, got {value}"
        return None
    return float(value)


_FIELDS = {
    "iteration",
    "epoch",
    "epoch_end",
    "iterations_total",
    "iter_time_s",
    "elapsed_s",
    "slowdown",
    "data_ratio",
}


def _clean(data: Any) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ReportError({"body": "expected a JSON object"})
    errors: dict[str, str] = {}
    for key in sorted(set(data) - _FIELDS):
        errors[key] = f"unknown field; known: {', '.join(sorted(_FIELDS))}"
    out: dict[str, Any] = {
        "iteration": _int(data, "iteration", errors),
        "epoch": _int(data, "epoch", errors),
        "iterations_total": _int(data, "iterations_total", errors, minimum=1),
        "iter_time_s": _float(data, "iter_time_s", errors, positive=True),
        "elapsed_s": _float(data, "elapsed_s", errors, positive=False),
        "slowdown": _float(data, "slowdown", errors, positive=True),
    }
    if out["iteration"] is None and "iteration" not in errors:
        errors["iteration"] = "required: the iterations done so far"
    end = data.get("epoch_end", False)
    if not isinstance(end, bool):
        errors["epoch_end"] = f"expected true or false, got {end!r}"
    out["epoch_end"] = end is True
    ratio = data.get("data_ratio")
    if ratio is not None:
        try:
            out["data_ratio"] = list(check_ratio(ratio if isinstance(ratio, list) else [ratio]))
        except RatioError as exc:
            errors["data_ratio"] = str(exc)
    if errors:
        raise ReportError(errors)
    return out


def _node_gpu_count(placement: Placement) -> int:
    return Gpu.objects.filter(node_id=placement.node_id).count()


def _own_gpus(placement: Placement) -> list[int]:
    part = placement.parts.filter(node_id=placement.node_id).first()
    if part is not None and part.gpu_indices:
        return sorted(part.gpu_indices)
    return sorted(g.index for g in placement.gpus.all() if g.node_id == placement.node_id)


def initial_ratio(placement: Placement, gpus: int) -> list[int]:
    """10/10 split evenly over the attempt's own GPUs on its node (largest remainder)."""
    own = [g for g in _own_gpus(placement) if 0 <= g < gpus] or [0]
    return list(largest_remainder([1.0 if g in own else 0.0 for g in range(max(gpus, 1))]))


def _solo_time(placement: Placement) -> float | None:
    job = placement.job
    if job.profile_id is None:
        return None
    model = (
        Gpu.objects.filter(pk__in=placement.gpus.values("pk")).values_list("model", flat=True)
    ).first()
    if model is None:
        return None
    return adapters.profile_to_domain(job.profile).solo_time_s(model)


def _state_of(placement: Placement) -> TrainingState:
    state = TrainingState.objects.select_for_update().filter(placement=placement).first()
    if state is not None:
        return state
    gpus = _node_gpu_count(placement)
    state = TrainingState.objects.create(
        placement=placement, ratio=initial_ratio(placement, gpus) if gpus else []
    )
    if state.ratio:
        DataRatioChange.objects.create(
            job_id=placement.job_id,
            attempt=placement.attempt,
            new=state.ratio,
            actor="start",
            explanation="initial data ratio: the batch split evenly over the attempt's GPUs",
        )
    return state


def training_report(placement: Placement, data: Any) -> dict[str, Any]:
    """Record a report of ``placement``'s job (see the module docstring); returns the reply.

    Raises ReportError (every bad field) before writing anything.
    """
    report = _clean(data)
    now = timezone.now()
    changed = False
    explanation = ""
    with transaction.atomic():
        # One report at a time per node: the DR manager reads every job of the node.
        locked_nodes().filter(pk=placement.node_id).first()
        state = _state_of(placement)
        state.iteration = report["iteration"]
        if report["epoch"] is not None:
            state.epoch = report["epoch"]
        if report["iterations_total"] is not None:
            state.iterations_total = report["iterations_total"]
        if report["iter_time_s"] is not None:
            state.iter_time_s = report["iter_time_s"]
        state.reported_at = now
        solo = _solo_time(placement)
        if report["epoch_end"]:
            started = placement.started_at or placement.job.started_at or placement.created_at
            elapsed = report["elapsed_s"]
            if elapsed is None:
                elapsed = max(0.0, (now - started).total_seconds())
            sd = report["slowdown"]  # the job's own figure wins (it knows its scale)
            if sd is None:
                sd = live_slowdown(
                    elapsed,
                    0.0,
                    solo,
                    iters_done=state.iteration,
                    iters_total=state.iterations_total,
                    iter_time_s=state.iter_time_s,
                )
            state.slowdown = sd
            state.epoch_ended = True
        state.save()
        if report["epoch_end"]:
            for change in _manage_node(placement.node):
                if change.placement_id == placement.pk:
                    changed, explanation = True, change.explanation
            state.refresh_from_db()
    workers = state.workers or max(1, len(_own_gpus(placement)))
    return {
        "job": placement.job_id,
        "attempt": placement.attempt,
        "epoch": state.epoch,
        "iteration": state.iteration,
        "data_ratio": list(state.ratio),
        "workers": workers,
        "slowdown": state.slowdown,
        "solo_time_s": solo,
        "changed": changed,
        "explanation": explanation,
    }


# --- the DR manager, live ---------------------------------------------------------------------


class _Applied:
    def __init__(self, placement_id: int, explanation: str) -> None:
        self.placement_id = placement_id
        self.explanation = explanation


def _ratio_policy() -> Any:
    """The active policy if it manages data ratios (has ``ratio_changes``), else None."""
    row = PolicySettings.objects.filter(active=True).first()
    if row is None:
        return None
    params = {k: v for k, v in (row.params or {}).items() if k != "seed"}
    try:
        policy = build_policy(row.policy, params)
    except PolicyError:
        return None
    return policy if hasattr(policy, "ratio_changes") else None


def node_utilisation(node: Node, now: Any = None) -> dict[int, float]:
    """GPU index -> the latest ``util_pct`` sample of each GPU of ``node`` (fresh ones only)."""
    now = now or timezone.now()
    out: dict[int, float] = {}
    for gpu in Gpu.objects.filter(node=node):
        sample = (
            MetricSample.objects.filter(
                gpu=gpu, metric="util_pct", at__gte=now - timedelta(seconds=UTIL_FRESH_S)
            )
            .order_by("-at")
            .first()
        )
        if sample is not None:
            out[gpu.index] = sample.value
    return out


def node_training_state(node: Node, now: Any = None) -> tuple[ClusterState, dict[str, Placement]]:
    """A snapshot of ``node`` for the DR manager: its GPUs with their utilisation and the
    running attempts that report through the SDK (with their data-parallel state)."""
    gpus = list(Gpu.objects.filter(node=node).order_by("index"))
    util = node_utilisation(node, now)
    gpu_states = tuple(
        GpuState(
            node=node.name,
            index=g.index,
            spec=adapters.gpu_spec_of(g),
            mode=SharingMode(g.current_mode),
            util_pct=util.get(g.index),
        )
        for g in gpus
    )
    node_state = NodeState(node.name, NodeKind(node.kind), node.cores, node.cores, gpus=gpu_states)
    rows = (
        TrainingState.objects.select_related("placement__job")
        .filter(placement__node=node, placement__active=True, placement__job__state__in=_LIVE)
        .order_by("placement__job_id")
    )
    running = []
    by_id: dict[str, Placement] = {}
    for row in rows:
        p = row.placement
        by_id[str(p.job_id)] = p
        running.append(
            RunningJob(
                job=JobSpec(id=str(p.job_id), name=p.job.name),
                placement=DomainPlacement(str(p.job_id), node.name, tuple(_own_gpus(p))),
                started_s=0.0,
                data_parallel=DataParallelState(
                    tuple(row.ratio), row.slowdown, row.epoch, row.epoch_ended
                ),
            )
        )
    state = ClusterState(0.0, (node_state,), (), tuple(running))
    return state, by_id


def _manage_node(node: Node) -> list[_Applied]:
    """Run the active policy's DR manager for ``node``'s jobs; apply and record its changes.
    Every answered epoch end is cleared, changed or not. Runs inside the caller's
    transaction (which holds the node's row)."""
    policy = _ratio_policy()
    if policy is None:
        return []
    state, by_id = node_training_state(node)
    applied = []
    for change in policy.ratio_changes(state):
        placement = by_id.get(change.job_id)
        if placement is None:
            continue
        if change.changed:
            data_ratio_set(
                placement,
                list(change.new),
                actor=f"policy:{policy.name}",
                explanation=change.explanation,
            )
            applied.append(_Applied(placement.pk, change.explanation))
        else:
            TrainingState.objects.filter(placement=placement).update(epoch_ended=False)
    return applied


def data_parallel_state(placement: Placement) -> DataParallelState | None:
    """The SDK state of ``placement`` for a snapshot (None: its job never reported)."""
    try:
        row = placement.training
    except TrainingState.DoesNotExist:
        return None
    if not row.ratio:
        return None
    return DataParallelState(tuple(row.ratio), row.slowdown, row.epoch, row.epoch_ended)


def data_ratio_set(placement: Placement, ratio: list[int], *, actor: str, explanation: str) -> bool:
    """Give ``placement``'s job ``ratio`` from its next epoch and record why. Returns False
    (and changes nothing) for a malformed ratio or an attempt that does not report."""
    state = TrainingState.objects.select_for_update().filter(placement=placement).first()
    if state is None:
        return False
    try:
        new = list(check_ratio(ratio, len(state.ratio) or None))
    except RatioError:
        return False
    old = list(state.ratio)
    TrainingState.objects.filter(pk=state.pk).update(ratio=new, epoch_ended=False)
    if new != old:
        DataRatioChange.objects.create(
            job_id=placement.job_id,
            attempt=placement.attempt,
            epoch=state.epoch,
            old=old,
            new=new,
            slowdown=state.slowdown,
            actor=actor,
            explanation=explanation[:2000],
        )
    return True


def ratio_history(job_id: int) -> list[dict[str, Any]]:
    """The job's data-ratio history, oldest first (for the job page and the API)."""
    return [
        {
            "at": c.at.isoformat(),
            "attempt": c.attempt,
            "epoch": c.epoch,
            "old": c.old,
            "new": c.new,
            "slowdown": c.slowdown,
            "actor": c.actor,
            "explanation": c.explanation,
        }
        for c in DataRatioChange.objects.filter(job_id=job_id)
    ]
