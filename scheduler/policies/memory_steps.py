"""A job's GPU memory over its run, from its profile's memory steps (ALGORITHMS.md §1 ``step_j``).

The same reading as the simulator (docs/simulator.md, "Memory"): step k spans progress
``[start_k, start_{k+1})`` (the last one up to 1) and the memory grows linearly from ``from_mb``
to ``to_mb`` across it; before the first step starts the job holds the first step's
``from_mb``. A job without steps holds ``JobSpec.memory_need_mb()`` the whole run.

Used by the ``exec_plan`` policy (predicting each GPU's memory) and by the placement policies of
seed 004 (the memory a job takes the moment it starts, checked against what the GPU uses now).
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.domain import JobSpec


@dataclass(frozen=True, slots=True)
class Step:
    """One memory phase: 1-based ``number``, progress span ``start..end``, MB ``low..peak``."""

    number: int
    start: float
    end: float
    low_mb: float
    peak_mb: float


def job_steps(job: JobSpec) -> tuple[Step, ...]:
    """The job's memory phases with their progress spans (empty when it has no steps)."""
    steps = job.profile.memory_steps if job.profile is not None else ()
    out: list[Step] = []
    for i, s in enumerate(steps):
        end = steps[i + 1].start_fraction if i + 1 < len(steps) else 1.0
        if end > s.start_fraction:
            out.append(Step(i + 1, s.start_fraction, end, s.from_mb, s.to_mb))
    if out and out[0].start > 0:
        first = out[0]
        out.insert(0, Step(first.number, 0.0, first.start, first.low_mb, first.low_mb))
    return tuple(out)


def step_at(steps: tuple[Step, ...], progress: float) -> Step | None:
    """The phase holding ``progress`` (the last one at or past the end), or None."""
    if not steps:
        return None
    for s in steps:
        if progress < s.end:
            return s
    return steps[-1]


def memory_at(job: JobSpec, progress: float, steps: tuple[Step, ...] | None = None) -> float:
    """GPU memory (MB per GPU) the job uses at ``progress`` (0..1)."""
    steps = job_steps(job) if steps is None else steps
    s = step_at(steps, progress)
    if s is None:
        return job.memory_need_mb()
    span = s.end - s.start
    frac = min(1.0, max(0.0, (progress - s.start) / span)) if span > 0 else 1.0
    return s.low_mb + (s.peak_mb - s.low_mb) * frac
