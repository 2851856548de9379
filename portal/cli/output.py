"""How the ``cosched`` CLI prints: a job's detail lines, tables, times, durations and JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import IO, Any


def _when(value: str | None) -> str:
    if not value:
        return "-"
    try:
        return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M:%S %Z").strip()
    except ValueError:
        return value


def _job_lines(job: dict[str, Any]) -> list[str]:
    rows: list[tuple[str, Any]] = [
        ("job", f"{job.get('id')}  {job.get('name', '')}"),
        ("state", job.get("state")),
        *([("waiting", job["waiting_reason"])] if job.get("waiting_reason") else []),
        ("owner", job.get("owner")),
        *([("project", job["project"])] if job.get("project") else []),
        ("kind", job.get("kind")),
        ("profile", _profile_text(job)),
        ("gpus", job.get("gpus")),
        ("gpu memory", f"{job['gpu_memory_mb']} MB" if job.get("gpu_memory_mb") else "-"),
        *([("sharing", job["sharing"])] if job.get("gpus") and job.get("sharing") else []),
        *([("device", job["device"])] if job.get("device") else []),
        ("cpus", job.get("cpus")),
        *([("memory", f"{job['memory_mb']} MB")] if job.get("memory_mb") else []),
        ("priority", job.get("priority")),
        *([("time limit", _limit_text(job))] if job.get("time_limit") else []),
        ("submitted", _when(job.get("submitted_at"))),
    ]
    for label, key in (("started", "started_at"), ("finished", "finished_at")):
        if job.get(key):
            rows.append((label, _when(job[key])))
    if job.get("held"):
        rows.append(("held", "yes (cosched release to let it start)"))
    if job.get("user_paused"):
        rows.append(("paused by", "a person (cosched resume to continue)"))
    if job.get("dependencies"):
        deps = ",".join(f"{d['type']}:{d['job']}" for d in job["dependencies"])
        rows.append(("depends on", deps))
    if job.get("array_job_id") is not None:
        limit = f", at most {job['array_limit']} at once" if job.get("array_limit") else ""
        rows.append(("array", f"task {job.get('array_index')} of {job['array_job_id']}{limit}"))
    if job.get("exit_code") is not None:
        rows.append(("exit code", job["exit_code"]))
    if job.get("failure_reason"):
        rows.append(("failure", job["failure_reason"]))
    if job.get("elastic_min_workers") is not None:
        rows.append(("elastic", _elastic_text(job)))
    placement = job.get("placement")
    if placement:
        indices = ",".join(str(g) for g in placement.get("gpus") or [])
        mode = placement.get("sharing_mode", "")
        if placement.get("mps_percentage"):
            mode += f" {placement['mps_percentage']}%"
        if placement.get("mig_profile"):
            mode += f" {placement['mig_profile']}"
        label = "placement" if placement.get("active", True) else "ran on"
        where = f"gpu {indices} ({mode.strip()})" if indices else "(CPU)"
        rows.append((label, f"{placement.get('node')} {where}"))
        rows.append(("policy", placement.get("policy")))
        if placement.get("explanation"):
            rows.append(("why", placement["explanation"]))
    return [f"{label:<11} {value}" for label, value in rows]


def _elastic_text(job: dict[str, Any]) -> str:
    """``1..4 workers, now 3 (attempt 4); 3 changes, last: 4 -> 3 workers (S=0.05): applied``."""
    text = f"{job['elastic_min_workers']}..{job.get('elastic_max_workers')} workers"
    current = [a for a in job.get("attempts") or [] if a.get("active")]
    if current:
        text += f", now {len(current[0].get('gpus') or [])} (attempt {current[0].get('attempt')})"
    changes = job.get("elastic_changes") or []
    if changes:
        last = changes[-1]
        what = last.get("summary") or "a change"  # ElasticChange.summary(), as the page shows
        if last.get("applied"):
            status = "applied"
        elif last.get("refused"):
            status = f"not applied: {last['refused']}"
        else:
            status = "proposed"
        text += f"; {len(changes)} change{'s' * (len(changes) != 1)}, last: {what}: {status}"
    return text


def _limit_text(job: dict[str, Any]) -> str:
    """``00:30:00 per attempt`` (an elastic job's regrouped attempts are one run)."""
    from scheduler.durations import format_duration

    per = "per attempt, regroups included" if job.get("elastic_min_workers") else "per attempt"
    try:
        return f"{format_duration(float(job['time_limit']))} {per}"
    except (TypeError, ValueError):
        return str(job["time_limit"])


def _profile_text(job: dict[str, Any]) -> str:
    if job.get("profile") is None:
        return "-"
    name = job.get("profile_name")
    return f"{name} (id {job['profile']})" if name else str(job["profile"])


def _table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def _shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    if width <= 0 or len(text) <= width:
        return text
    return text[: max(1, width - 1)] + "…"


def _emit_json(data: Any, out: IO[str]) -> None:
    out.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"
