"""Profiles as JSON, and a job's GPU memory at a given point of its run.

This is the profile-passing contract between the node agent and a job process that must not need
Django (``python -m workers.emulate``), and the memory-step reading shared by the emulator and the
virtual GPU backend.

**JSON form of a profile** (one object; every key but ``name`` optional; unknown keys ignored so
older readers accept newer writers)::

    {"name": "lammps", "kind": "hpc", "cpu_time_s": 990, "gpu_time_s": {"TitanXp": 85},
     "gpu_memory_max_mb": 2273, "gpu_memory_avg_mb": 1500, "gpu_util_pct": 80,
     "memory_steps": [{"start_fraction": 0, "from_mb": 0, "to_mb": 833}, ...],
     "stall": {"memory_dependency": 40, ...}, ...any other scalar field of scheduler.domain.Profile}

``memory_steps`` entries may also be ``[start_fraction, from_mb, to_mb]`` triples. A *profile
document* is one such object, a list of them, or an object mapping profile names to them;
``select_profile`` picks one by name. It reaches a process as a file (``--profile-file PATH``) or
as the text of the environment variable ``COSCHED_PROFILE_JSON``.

**Memory at progress** (reading of ALGORITHMS.md §1 ``step_j``): step j runs from its
``start_fraction`` to the next step's (the last one to 1.0); inside it memory grows linearly from
``from_mb`` to ``to_mb``. Before the first step the job holds the first step's ``from_mb``.
Without steps it holds ``gpu_memory_avg_mb``, else ``gpu_memory_max_mb``, else 0.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from scheduler.domain import JobKind, MemoryStep, Profile, StallReasons

PROFILE_ENV = "COSCHED_PROFILE_JSON"

_FIELDS = {f.name for f in dataclasses.fields(Profile)}


class ProfileFormatError(ValueError):
    """A profile document could not be read."""


def steps_from_json(data: Any) -> tuple[MemoryStep, ...]:
    """Memory steps from a list of objects or ``[start_fraction, from_mb, to_mb]`` triples.

    Sorted by ``start_fraction``; raises ProfileFormatError on a malformed entry.
    """
    if not isinstance(data, list):
        raise ProfileFormatError(f"memory steps must be a list, not {type(data).__name__}")
    steps = []
    for entry in data:
        try:
            if isinstance(entry, Mapping):
                step = MemoryStep(
                    float(entry["start_fraction"]), float(entry["from_mb"]), float(entry["to_mb"])
                )
            else:
                start, lo, hi = entry
                step = MemoryStep(float(start), float(lo), float(hi))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileFormatError(f"bad memory step {entry!r}: {exc}") from exc
        if not 0.0 <= step.start_fraction <= 1.0:
            raise ProfileFormatError(f"step start_fraction must be in 0..1: {entry!r}")
        steps.append(step)
    return tuple(sorted(steps, key=lambda s: s.start_fraction))


def profile_from_json(data: Mapping[str, Any]) -> Profile:
    """A Profile from its JSON object (see the module docstring)."""
    if not isinstance(data, Mapping) or not data.get("name"):
        raise ProfileFormatError("a profile needs at least a name")
    kwargs: dict[str, Any] = {k: v for k, v in data.items() if k in _FIELDS}
    if "kind" in kwargs:
        try:
            kwargs["kind"] = JobKind(kwargs["kind"])
        except ValueError as exc:
            raise ProfileFormatError(f"unknown job kind {kwargs['kind']!r}") from exc
    if "gpu_time_s" in kwargs:
        kwargs["gpu_time_s"] = {str(k): float(v) for k, v in (kwargs["gpu_time_s"] or {}).items()}
    if "memory_steps" in kwargs:
        kwargs["memory_steps"] = steps_from_json(kwargs["memory_steps"] or [])
    if isinstance(kwargs.get("stall"), Mapping):
        kwargs["stall"] = StallReasons(**kwargs["stall"])
    try:
        return Profile(**kwargs)
    except TypeError as exc:
        raise ProfileFormatError(str(exc)) from exc


def profile_to_json(profile: Profile) -> dict[str, Any]:
    """The JSON object of ``profile``; None fields are left out."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(Profile):
        value = getattr(profile, f.name)
        if value is None or value == () or value == {}:
            continue
        if f.name == "memory_steps":
            value = [dataclasses.asdict(s) for s in value]
        elif f.name == "stall":
            value = dataclasses.asdict(value)
        elif f.name == "gpu_time_s":
            value = dict(value)
        elif f.name == "kind":
            value = str(value)
        out[f.name] = value
    return out


def select_profile(document: Any, name: str | None) -> Profile:
    """The profile called ``name`` in a profile document (object, list or name -> object map).

    With a single profile, ``name`` may be None or must match it; raises ProfileFormatError
    (with the names found) when the profile is not there.
    """
    candidates: list[Mapping[str, Any]]
    if isinstance(document, Mapping) and "name" in document:
        candidates = [document]
    elif isinstance(document, Mapping):
        candidates = [{"name": k, **v} for k, v in document.items() if isinstance(v, Mapping)]
    elif isinstance(document, list):
        candidates = [d for d in document if isinstance(d, Mapping)]
    else:
        raise ProfileFormatError("a profile document is an object or a list of objects")
    if name is None and len(candidates) == 1:
        return profile_from_json(candidates[0])
    for data in candidates:
        if data.get("name") == name:
            return profile_from_json(data)
    found = ", ".join(str(d.get("name")) for d in candidates) or "none"
    raise ProfileFormatError(f"profile {name!r} not in the profile document (found: {found})")


def load_profile(
    name: str | None,
    *,
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> Profile | None:
    """The profile ``name`` from ``path`` if given, else from ``$COSCHED_PROFILE_JSON``.

    Returns None when neither source is present; raises ProfileFormatError on bad JSON or a
    missing name.
    """
    env = os.environ if env is None else env
    if path is not None:
        text = Path(path).read_text(encoding="utf-8")
        where = str(path)
    elif env.get(PROFILE_ENV):
        text = env[PROFILE_ENV]
        where = f"${PROFILE_ENV}"
    else:
        return None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileFormatError(f"{where} is not valid JSON: {exc}") from exc
    return select_profile(document, name)


def profiles_document(profiles: Iterable[Profile]) -> str:
    """JSON text of a name -> profile map, for a file or ``$COSCHED_PROFILE_JSON``."""
    return json.dumps({p.name: profile_to_json(p) for p in profiles}, sort_keys=True)


def _step_end(steps: tuple[MemoryStep, ...], i: int) -> float:
    return steps[i + 1].start_fraction if i + 1 < len(steps) else 1.0


def step_index_at(profile: Profile, fraction: float) -> int:
    """1-based index of the memory step the job is in at ``fraction`` (0..1) of its run.

    0 before the first step starts or when the profile has no steps.
    """
    index = 0
    for i, step in enumerate(profile.memory_steps):
        if fraction >= step.start_fraction:
            index = i + 1
    return index


def memory_at(profile: Profile, fraction: float) -> float:
    """GPU memory (MB) the job holds at ``fraction`` (0..1) of its run; see the module docstring."""
    steps = profile.memory_steps
    if not steps:
        if profile.gpu_memory_avg_mb is not None:
            return float(profile.gpu_memory_avg_mb)
        return float(profile.gpu_memory_max_mb or 0.0)
    fraction = min(1.0, max(0.0, fraction))
    i = step_index_at(profile, fraction) - 1
    if i < 0:
        return steps[0].from_mb
    step = steps[i]
    span = _step_end(steps, i) - step.start_fraction
    if span <= 0:
        return step.to_mb
    into = min(1.0, (fraction - step.start_fraction) / span)
    return step.from_mb + (step.to_mb - step.from_mb) * into


def peak_memory(profile: Profile) -> float:
    """The most GPU memory (MB) the job holds over its run."""
    if profile.memory_steps:
        return max(max(s.from_mb, s.to_mb) for s in profile.memory_steps)
    return float(profile.gpu_memory_max_mb or profile.gpu_memory_avg_mb or 0.0)
