"""Job control (docs/job-control.md): dependencies, arrays, holds and output paths.

The scheduling cycle asks ``gate_pending`` which queued jobs may be offered to the policy at
all: a held job, a job whose dependencies are not met yet and an array task beyond its array's
concurrency limit are left out (with the waiting reason stored on the job), and a job whose
dependency can never be met is cancelled. The policies never see any of this.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from portal.core.states import PLACED, TERMINAL, JobState

DEPENDENCY_TYPES = ("after", "afterok", "afternotok", "afterany")
#: The most tasks one array submission may create.
ARRAY_MAX_TASKS = 10_000
#: The most dependencies one job may name.
MAX_DEPENDENCIES = 100
HELD_REASON = "held by its owner: release it to let it start"

_ARRAY_RE = re.compile(r"^\s*([0-9,\-:]+)\s*(?:%\s*([0-9]+))?\s*$")


def parse_dependencies(value: Any) -> list[dict[str, Any]]:
    """Normalise dependencies to ``[{"type": "afterok", "job": 812}, ...]``.

    Accepted: Slurm's string form (``"afterok:812:813,after:900"``; a bare id means afterany),
    or a list of such strings or ``{"type", "job"}`` objects. Raises ValueError with a message.
    """
    if value is None or value == "":
        return []
    items: list[Any]
    if isinstance(value, str):
        items = [v for v in value.replace(" ", "").split(",") if v]
    elif isinstance(value, list):
        items = value
    else:
        raise ValueError('give a string like "afterok:812" or a list of {"type", "job"}')
    out: list[dict[str, Any]] = []
    for item in items:
        ids: list[Any]
        if isinstance(item, dict):
            kind, ids = item.get("type", "afterany"), [item.get("job")]
        elif isinstance(item, str):
            kind, _, rest = item.partition(":")
            if not rest:  # "812": afterany
                kind, rest = "afterany", kind
            ids = rest.split(":")
        elif isinstance(item, int) and not isinstance(item, bool):
            kind, ids = "afterany", [item]
        else:
            raise ValueError(f"cannot read dependency {item!r}")
        if kind not in DEPENDENCY_TYPES:
            raise ValueError(
                f"unknown dependency type {kind!r}; one of {', '.join(DEPENDENCY_TYPES)}"
            )
        for raw in ids:
            if isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) < 19:
                job_id = int(raw)
            elif isinstance(raw, int) and not isinstance(raw, bool) and raw < 2**62:
                job_id = raw
            else:
                raise ValueError(f"{kind}: {raw!r} is not a job id")
            if job_id <= 0:
                raise ValueError(f"{kind}: {raw!r} is not a job id")
            entry = {"type": kind, "job": job_id}
            if entry not in out:
                out.append(entry)
    if len(out) > MAX_DEPENDENCIES:
        raise ValueError(f"at most {MAX_DEPENDENCIES} dependencies")
    return out


def dependencies_text(deps: Sequence[dict[str, Any]]) -> str:
    """``[{"type": "afterok", "job": 8}, ...]`` in Slurm's form, ``afterok:8,after:9``."""
    return ",".join(f"{d['type']}:{d['job']}" for d in deps)


def dependency_errors(
    owner: Any, deps: Sequence[dict[str, Any]], *, job_id: int | None = None
) -> list[str]:
    """Why ``deps`` cannot be used by ``owner`` (each job must exist and be theirs, and not be
    the job itself); empty when they can."""
    from portal.core.models import Job

    ids = {d["job"] for d in deps}
    if not ids:
        return []
    if job_id is not None and job_id in ids:
        return [f"job {job_id} cannot depend on itself"]
    owned = set(Job.objects.filter(pk__in=ids, owner=owner).values_list("pk", flat=True))
    missing = sorted(ids - owned)
    if missing:
        return [
            f"no job {', '.join(map(str, missing))} of yours: "
            "a job may depend only on your own jobs"
        ]
    return []


def dependency_cycle(job_id: int, deps: Sequence[dict[str, Any]]) -> list[int] | None:
    """The chain of jobs through which ``job_id`` would wait for itself if it got ``deps``
    (None: no cycle). Only jobs still PENDING can close a cycle (the others have started)."""
    from portal.core.models import Job

    parent: dict[int, int] = {}
    frontier = [d["job"] for d in deps]
    for other in frontier:
        parent.setdefault(other, job_id)
    seen: set[int] = set()
    while frontier:
        if job_id in frontier:
            chain = [job_id]
            at = parent[job_id]
            while at != job_id:
                chain.append(at)
                at = parent[at]
            return [job_id, *reversed(chain[1:])]
        rows = Job.objects.filter(pk__in=frontier, state=JobState.PENDING).values_list(
            "pk", "dependencies"
        )
        seen.update(frontier)
        frontier = []
        for pk, their in rows:
            for d in their or ():
                nxt = d.get("job")
                if isinstance(nxt, int) and (nxt not in seen or nxt == job_id):
                    parent.setdefault(nxt, pk)
                    frontier.append(nxt)
    return None


@dataclass(frozen=True)
class ArraySpec:
    indices: tuple[int, ...]
    limit: int | None = None


def parse_array(text: str) -> ArraySpec:
    """``0-99%8``, ``1,3,5-7``, ``0-15:4%2`` (Slurm's forms): the task indices and the most
    tasks running at once. Raises ValueError with a message."""
    match = _ARRAY_RE.match(text or "")
    if not match:
        raise ValueError('give indices like "0-99", "1,3,5-7" or "0-15:4", optionally "%8"')
    indices: list[int] = []
    for part in match.group(1).split(","):
        if not part:
            raise ValueError("an empty index range")
        span, _, step_text = part.partition(":")
        low_text, dash, high_text = span.partition("-")
        try:
            low = int(low_text)
            high = int(high_text) if dash else low
            step = int(step_text) if step_text else 1
        except ValueError:
            raise ValueError(f"cannot read the range {part!r}") from None
        if high < low or step < 1:
            raise ValueError(f"the range {part!r} is empty")
        if (high - low) // step + 1 + len(indices) > ARRAY_MAX_TASKS:
            raise ValueError(f"at most {ARRAY_MAX_TASKS:,} tasks in one array")
        indices.extend(range(low, high + 1, step))
    unique = tuple(sorted(set(indices)))
    limit = int(match.group(2)) if match.group(2) else None
    if limit is not None and limit < 1:
        raise ValueError("the limit after % must be at least 1")
    return ArraySpec(unique, limit)


def expand_path(pattern: str, *, job_id: int, user: str, array_index: int | None) -> str:
    """Slurm's filename patterns: ``%j`` job id, ``%a`` array index (0 outside an array),
    ``%u`` user name, ``%%`` a percent sign; other ``%x`` stay as they are."""

    def sub(m: re.Match[str]) -> str:
        key = m.group(1)
        if key == "j":
            return str(job_id)
        if key == "a":
            return str(array_index if array_index is not None else 0)
        if key == "u":
            return user
        if key == "%":
            return "%"
        return m.group(0)

    return re.sub(r"%(.)", sub, pattern)


def output_path_errors(value: str) -> list[str]:
    """Why an output / error path pattern is refused (empty: fine)."""
    if "\x00" in value or "\n" in value:
        return ["no NUL or newline characters"]
    if len(value) > 1000:
        return ["at most 1000 characters"]
    if any(part == ".." for part in value.split("/")):
        return ["no '..' components"]
    return []


# ---------------------------------------------------------------------------------------------
# The cycle's gate


@dataclass
class Gate:
    """What ``gate_pending`` decided: the ids offered to the policy, in queue order; the
    reasons of those left out; the jobs to cancel (a dependency never met), with why."""

    eligible: list[int] = field(default_factory=list)
    waiting: dict[int, str] = field(default_factory=dict)
    doomed: dict[int, str] = field(default_factory=dict)


def _dependency_state(
    dep: dict[str, Any], state: str | None, started: bool
) -> tuple[bool, str | None]:
    """(met, never-met reason) of one dependency on a job in ``state``."""
    kind, other = dep["type"], dep["job"]
    if state is None:
        return False, f"job {other} does not exist any more"
    ended = state in TERMINAL
    if kind == "after":
        if started or state in PLACED or (ended and state == JobState.COMPLETED):
            return True, None
        if ended:
            return False, f"job {other} ended {state} without starting ({kind})"
        return False, None
    if kind == "afterany":
        return ended, None
    if kind == "afterok":
        if state == JobState.COMPLETED:
            return True, None
        if ended:
            return False, f"job {other} ended {state}, not COMPLETED ({kind})"
        return False, None
    # afternotok
    if state in (JobState.FAILED, JobState.CANCELLED):
        return True, None
    if ended:
        return False, f"job {other} ended {state} ({kind} waits for a failure)"
    return False, None


def gate_pending(rows: Sequence[Any], placed_per_array: dict[int, int] | None = None) -> Gate:
    """Decide which queued jobs (``rows``: Job rows in queue order, with ``held``,
    ``dependencies``, ``array_of_id``, ``array_limit``) the policy may see this cycle.

    ``placed_per_array``: array id -> tasks holding a placement now (read here if None)."""
    from portal.core.models import Job

    gate = Gate()
    dep_ids = {d["job"] for r in rows for d in (r.dependencies or ())}
    states: dict[int, tuple[str, bool]] = {}
    if dep_ids:
        states = {
            pk: (state, started is not None)
            for pk, state, started in Job.objects.filter(pk__in=dep_ids).values_list(
                "pk", "state", "started_at"
            )
        }
    arrays = {r.array_of_id for r in rows if r.array_of_id is not None and r.array_limit}
    if placed_per_array is None:
        placed_per_array = _placed_per_array(arrays)
    room: dict[int, int | None] = {a: None for a in arrays}
    for r in rows:
        if r.array_of_id in arrays and room[r.array_of_id] is None:
            room[r.array_of_id] = max(0, r.array_limit - placed_per_array.get(r.array_of_id, 0))
    for r in rows:
        if r.held:
            gate.waiting[r.pk] = HELD_REASON
            continue
        blocked: str | None = None
        for dep in r.dependencies or ():
            state, started = states.get(dep["job"], (None, False))
            met, never = _dependency_state(dep, state, started)
            if never:
                gate.doomed[r.pk] = f"dependency never satisfied: {never}"
                break
            if not met and blocked is None:
                verb = "to start" if dep["type"] == "after" else "to complete"
                if dep["type"] == "afternotok":
                    verb = "to fail"
                blocked = f"waiting for job {dep['job']} {verb} ({dep['type']})"
        if r.pk in gate.doomed:
            continue
        if blocked:
            gate.waiting[r.pk] = blocked
            continue
        if r.array_of_id in arrays:
            left = room[r.array_of_id] or 0
            if left <= 0:
                gate.waiting[r.pk] = (
                    f"array {r.array_of_id} runs at most {r.array_limit} tasks at once"
                )
                continue
            room[r.array_of_id] = left - 1
        gate.eligible.append(r.pk)
    return gate


def _placed_per_array(arrays: Iterable[int]) -> dict[int, int]:
    from portal.core.models import Job

    ids = list(arrays)
    if not ids:
        return {}
    return dict(
        Counter(
            Job.objects.filter(
                array_of_id__in=ids, state__in=[s.value for s in PLACED]
            ).values_list("array_of_id", flat=True)
        )
    )
