"""Accounting from the attempt records: GPU-seconds by GPU model, CPU-seconds and wait per job,
summed per user and project; and the ``Accounts`` (quotas, decayed usage, shares) the scheduling
snapshot hands to the policy (docs/projects.md).

An attempt (``core.Placement``) runs from its start (``started_at``: every part started; else
its earliest started part) to its release (``released_at``; now while it is active). It uses
its GPUs and the cores of every part for that time. A job's **wait** is the time it was not
running between submission and its end (now for an unfinished job): time queued before its
first attempt, between attempts (requeued), and scheduled but not started yet.

A report over a window ``[since, until)`` counts the part of each attempt inside the window;
its rows are the jobs submitted in the window or with an attempt overlapping it, and every total
is the sum of those job rows.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Min, Q, Subquery

from portal.core.models import Job, Placement
from portal.teams.models import Project, ProjectQuota
from scheduler.catalog import UnknownGpuModel, canonical_model
from scheduler.domain import Accounts
from scheduler.domain import ProjectQuota as DomainQuota
from scheduler.fairshare import decayed_usage

BY_CHOICES = ("project", "user", "job")


def _model_key(model: str) -> str:
    try:
        return canonical_model(model)
    except UnknownGpuModel:
        return model


@dataclass
class Attempt:
    """One attempt's use: when it ran, its GPUs by model and its cores."""

    job_id: int
    start: datetime
    end: datetime
    gpus_by_model: dict[str, int]
    cpus: int

    def seconds_within(self, since: datetime | None, until: datetime | None) -> float:
        start = self.start if since is None else max(self.start, since)
        end = self.end if until is None else min(self.end, until)
        return max(0.0, (end - start).total_seconds())


def _attempt_of(p: Placement, now: datetime) -> Attempt | None:
    parts = list(p.parts.all())
    start = p.started_at
    if start is None:
        started = [part.started_at for part in parts if part.started_at is not None]
        start = min(started) if started else None
    if start is None:
        return None  # never ran
    end = p.released_at if p.released_at is not None else now
    if not p.active and p.released_at is None:
        end = start
    models: dict[str, int] = defaultdict(int)
    for gpu in p.gpus.all():
        models[_model_key(gpu.model)] += 1
    cpus = sum(part.cpus for part in parts) if parts else p.cpus
    return Attempt(p.job_id, start, max(start, end), dict(models), cpus)


def attempts_of(placements: Iterable[Placement], now: datetime) -> list[Attempt]:
    """The attempts that ran, from placement rows (prefetch ``gpus`` and ``parts``)."""
    out = []
    for p in placements:
        attempt = _attempt_of(p, now)
        if attempt is not None:
            out.append(attempt)
    return out


# -- per-job records and totals ---------------------------------------------------------------


@dataclass
class UsageRecord:
    """One job's use in a window (seconds; GPU-seconds per GPU model)."""

    job_id: int
    name: str
    user: str
    project: str
    state: str
    submitted_at: datetime
    gpu_seconds_by_model: dict[str, float] = field(default_factory=dict)
    cpu_seconds: float = 0.0
    run_seconds: float = 0.0
    wait_seconds: float = 0.0
    attempts: int = 0

    @property
    def gpu_seconds(self) -> float:
        return sum(self.gpu_seconds_by_model.values())


def usage_records(
    jobs: Any, *, since: datetime | None, until: datetime | None, now: datetime
) -> list[UsageRecord]:
    """Per-job usage of ``jobs`` (a ``Job`` queryset) in ``[since, until)`` (see the module
    docstring), oldest submission first."""
    until_eff = min(until, now) if until is not None else now
    window = Q()
    if since is not None:
        window &= Q(submitted_at__gte=since) | Q(
            Q(placements__released_at__isnull=True) | Q(placements__released_at__gt=since),
            placements__isnull=False,
        )
    window &= Q(submitted_at__lt=until_eff)
    matching = jobs.filter(window).order_by().values("pk")
    job_rows = list(
        Job.objects.filter(pk__in=Subquery(matching))
        .select_related("owner", "project")
        .order_by("submitted_at", "id")
    )
    ids = [j.pk for j in job_rows]
    attempts: dict[int, list[Attempt]] = defaultdict(list)
    placements = Placement.objects.filter(job_id__in=ids).prefetch_related("gpus", "parts")
    for a in attempts_of(placements, now):
        attempts[a.job_id].append(a)
    records = []
    for job in job_rows:
        rec = UsageRecord(
            job_id=job.pk,
            name=job.name,
            user=job.owner.get_username(),
            project=job.project.name if job.project else "",
            state=job.state,
            submitted_at=job.submitted_at,
        )
        by_model: dict[str, float] = defaultdict(float)
        ran_whole = 0.0
        for a in attempts[job.pk]:
            seconds = a.seconds_within(since, until_eff)
            rec.attempts += 1
            rec.run_seconds += seconds
            rec.cpu_seconds += seconds * a.cpus
            for model, n in a.gpus_by_model.items():
                by_model[model] += seconds * n
            ran_whole += a.seconds_within(None, job.finished_at or now)
        rec.gpu_seconds_by_model = dict(by_model)
        end = job.finished_at or now
        rec.wait_seconds = max(0.0, (end - job.submitted_at).total_seconds() - ran_whole)
        records.append(rec)
    return records


def usage_totals(records: Iterable[UsageRecord], by: str) -> list[dict[str, Any]]:
    """Rows summing ``records`` per project, user or job (``by``), largest GPU use first."""
    if by not in BY_CHOICES:
        raise ValueError(f"by must be one of {', '.join(BY_CHOICES)}")
    groups: dict[str, dict[str, Any]] = {}
    for rec in records:
        key = {"project": rec.project, "user": rec.user, "job": str(rec.job_id)}[by]
        row = groups.setdefault(
            key,
            {
                by: key,
                "jobs": 0,
                "gpu_seconds": 0.0,
                "gpu_seconds_by_model": defaultdict(float),
                "cpu_seconds": 0.0,
                "wait_seconds": 0.0,
            },
        )
        if by == "job":
            row.update(name=rec.name, user=rec.user, project=rec.project, state=rec.state)
        row["jobs"] += 1
        row["gpu_seconds"] += rec.gpu_seconds
        row["cpu_seconds"] += rec.cpu_seconds
        row["wait_seconds"] += rec.wait_seconds
        for model, s in rec.gpu_seconds_by_model.items():
            row["gpu_seconds_by_model"][model] += s
    rows = []
    for row in groups.values():
        row["gpu_seconds_by_model"] = dict(sorted(row["gpu_seconds_by_model"].items()))
        row["mean_wait_seconds"] = row["wait_seconds"] / row["jobs"] if row["jobs"] else 0.0
        rows.append(row)
    rows.sort(key=lambda r: (-r["gpu_seconds"], str(r[by])))
    return rows


# -- fair share and the scheduling snapshot ---------------------------------------------------


def _half_life_s() -> float:
    return float(settings.COSCHED.get("FAIRSHARE_HALF_LIFE_S", 7 * 24 * 3600.0))


def decayed_usage_by_account(now: datetime) -> dict[tuple[str, str], float]:
    """``(project name, user id) -> decayed usage`` (GPU-seconds plus CPU core-seconds times
    ``FAIRSHARE_CPU_WEIGHT``, halved every ``FAIRSHARE_HALF_LIFE_S``), over attempts released
    within ten half-lives or still active."""
    half_life = _half_life_s()
    cpu_weight = float(settings.COSCHED.get("FAIRSHARE_CPU_WEIGHT", 0.0))
    recent = Q(released_at__isnull=True)
    if half_life > 0:
        recent |= Q(released_at__gte=now - timedelta(seconds=10 * half_life))
    else:
        recent |= Q(released_at__isnull=False)
    # One aggregate query, no model instances: this runs in every scheduling cycle.
    rows = (
        Placement.objects.filter(recent)
        .annotate(n_gpus=Count("gpus", distinct=True), first_part=Min("parts__started_at"))
        .values_list(
            "started_at",
            "first_part",
            "released_at",
            "active",
            "cpus",
            "n_gpus",
            "job__owner_id",
            "job__project__name",
        )
    )
    usage: dict[tuple[str, str], float] = defaultdict(float)
    ref = now.timestamp()
    for started, first_part, released, active, cpus, n_gpus, owner_id, project in rows:
        start = started or first_part
        if start is None:
            continue
        end = released if released is not None else (now if active else start)
        rate = float(n_gpus) or cpus * cpu_weight
        if rate <= 0:
            continue
        usage[(project or "", str(owner_id))] += decayed_usage(
            rate, start.timestamp(), end.timestamp(), ref, half_life
        )
    return dict(usage)


def accounts_snapshot(now: datetime) -> Accounts:
    """The quotas, decayed usage and shares the scheduling snapshot carries."""
    quotas = tuple(
        DomainQuota(q.project.name, _model_key(q.gpu_model), q.guaranteed_gpus, q.borrow_limit_gpus)
        for q in ProjectQuota.objects.select_related("project")
    )
    shares = {
        name: float(s)
        for name, s in Project.objects.exclude(shares=1.0).values_list("name", "shares")
    }
    return Accounts(quotas=quotas, usage=decayed_usage_by_account(now), shares=shares)


def fair_share_of(user: Any, now: datetime) -> list[dict[str, Any]]:
    """Per project of ``user``: their role, its quotas with the GPUs its jobs hold now, their
    decayed usage, the project's, and their fair-share factor as of now (the account page and
    ``GET /api/v1/projects/``). GPU-hours are decayed GPU-seconds / 3600."""
    from portal.core.models import Gpu
    from portal.teams.models import Membership
    from scheduler.fairshare import fair_share_factors

    memberships = list(
        Membership.objects.filter(user=user)
        .select_related("project")
        .prefetch_related("project__quotas")
        .order_by("project__name")
    )
    names = [m.project.name for m in memberships]
    held: dict[tuple[str, str], int] = defaultdict(int)
    for project, model, n in (
        Gpu.objects.filter(placements__active=True, placements__job__project__name__in=names)
        .values_list("placements__job__project__name", "model")
        .annotate(n=Count("id"))
    ):
        held[(project, _model_key(model))] += n
    accounts = accounts_snapshot(now)
    # The pairs the scheduler would see (usage or a queued job), and the user's own.
    usage = dict(accounts.usage)
    queued = Job.objects.filter(state="PENDING").values_list("project__name", "owner_id")
    for name, owner_id in queued.distinct():
        usage.setdefault((name or "", str(owner_id)), 0.0)
    for name in names:
        usage.setdefault((name, str(user.pk)), 0.0)
    factors = fair_share_factors(Accounts(usage=usage, shares=accounts.shares))
    out = []
    for m in memberships:
        name = m.project.name
        key = (name, str(user.pk))
        quotas = [
            {
                "gpu_model": _model_key(q.gpu_model),
                "guaranteed_gpus": q.guaranteed_gpus,
                "borrow_limit_gpus": q.borrow_limit_gpus,
                "in_use_gpus": held.get((name, _model_key(q.gpu_model)), 0),
            }
            for q in m.project.quotas.all()
        ]
        out.append(
            {
                "project": name,
                "role": m.role,
                "is_default": m.is_default,
                "personal": m.project.personal_of_id == user.pk,
                "shares": m.project.shares,
                "quotas": quotas,
                "my_usage_gpu_hours": usage.get(key, 0.0) / 3600.0,
                "project_usage_gpu_hours": sum(v for (p, _u), v in usage.items() if p == name)
                / 3600.0,
                "factor": factors.get(key, 1.0),
            }
        )
    return out


__all__ = [
    "BY_CHOICES",
    "Attempt",
    "UsageRecord",
    "accounts_snapshot",
    "attempts_of",
    "decayed_usage_by_account",
    "fair_share_of",
    "usage_records",
    "usage_totals",
]


# -- report windows, CSV and the figure -------------------------------------------------------

_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SPAN = re.compile(r"[0-9]{1,12}(\.[0-9]{1,6})?", re.ASCII)
#: The longest report window: a ``since`` further back than this is a 400 naming the limit.
MAX_WINDOW_DAYS = 100 * 365


def window_error(since: datetime, now: datetime) -> str | None:
    """Why a report may not start at ``since`` (None: it may)."""
    if since < now - timedelta(days=MAX_WINDOW_DAYS):
        return (
            f"is more than {MAX_WINDOW_DAYS:,} days ({MAX_WINDOW_DAYS // 365} years) back, "
            "the longest window a report covers"
        )
    return None


def parse_when(text: str | None, now: datetime) -> datetime | None:
    """``"7d"``, ``"24h"``, ``"30m"``, ``"2w"`` (that long before ``now``), an ISO date or
    date-time (UTC unless it says), or empty (None). Raises ``ValueError`` saying why."""
    from django.utils.dateparse import parse_date, parse_datetime
    from django.utils.timezone import make_aware

    if text is None or not str(text).strip():
        return None
    text = str(text).strip()
    unit = _UNITS.get(text[-1:].lower())
    if unit is not None and _SPAN.fullmatch(text[:-1]):
        seconds = float(text[:-1]) * unit
        if seconds > MAX_WINDOW_DAYS * 86400:
            raise ValueError(
                f"{text!r} reaches back more than {MAX_WINDOW_DAYS:,} days "
                f"({MAX_WINDOW_DAYS // 365} years), the longest window a report covers"
            )
        return now - timedelta(seconds=seconds)
    try:
        moment = parse_datetime(text)
        if moment is None:
            day = parse_date(text)
            if day is not None:
                moment = datetime(day.year, day.month, day.day)
    except ValueError:
        moment = None
    if moment is None:
        raise ValueError(
            f"{text!r} is not a date (2026-11-01), a date-time (2026-11-01T08:00) or "
            "a span back from now (30m, 24h, 7d, 2w)"
        )
    if moment.tzinfo is None:
        from datetime import UTC

        moment = make_aware(moment, UTC)
    return moment


CSV_COLUMNS = ("jobs", "gpu_seconds", "cpu_seconds", "wait_seconds", "mean_wait_seconds")


def usage_csv(rows: list[dict[str, Any]], by: str) -> str:
    """The rows as CSV: the group, the job columns when ``by`` is job, the totals, then one
    ``gpu_seconds_<model>`` column per GPU model."""
    import csv
    import io

    models = sorted({m for row in rows for m in row["gpu_seconds_by_model"]})
    extra = ["name", "user", "project", "state"] if by == "job" else []
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow([by, *extra, *CSV_COLUMNS, *(f"gpu_seconds_{m}" for m in models)])
    for row in rows:
        writer.writerow(
            [
                row[by],
                *(row.get(k, "") for k in extra),
                *(round(row[c], 3) if isinstance(row[c], float) else row[c] for c in CSV_COLUMNS),
                *(round(row["gpu_seconds_by_model"].get(m, 0.0), 3) for m in models),
            ]
        )
    return buffer.getvalue()


def usage_figure(rows: list[dict[str, Any]], by: str) -> dict[str, Any]:
    """A plotly figure (plain dict): GPU-hours per group stacked by GPU model, and the mean
    wait in hours on a second axis. Pure: used by the usage page."""
    groups = [str(r[by]) for r in rows]
    models = sorted({m for r in rows for m in r["gpu_seconds_by_model"]})
    data: list[dict[str, Any]] = [
        {
            "type": "bar",
            "name": f"{m} GPU-hours",
            "x": groups,
            "y": [round(r["gpu_seconds_by_model"].get(m, 0.0) / 3600, 4) for r in rows],
        }
        for m in models
    ]
    data.append(
        {
            "type": "bar",
            "name": "CPU core-hours",
            "x": groups,
            "y": [round(r["cpu_seconds"] / 3600, 4) for r in rows],
            "visible": "legendonly",
        }
    )
    data.append(
        {
            "type": "scatter",
            "mode": "markers",
            "name": "mean wait (h)",
            "x": groups,
            "y": [round(r["mean_wait_seconds"] / 3600, 4) for r in rows],
            "yaxis": "y2",
        }
    )
    return {
        "data": data,
        "layout": {
            "barmode": "stack",
            "xaxis": {"title": {"text": by}, "type": "category"},
            "yaxis": {"title": {"text": "hours"}},
            "yaxis2": {"title": {"text": "mean wait (h)"}, "overlaying": "y", "side": "right"},
            "legend": {"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"},
            "margin": {"t": 50},
        },
    }
