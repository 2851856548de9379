"""What the simulator records: the timeline, Slow-Down samples and one record per job.

``SimResult`` (``scheduler.simulator.results``) carries them; the metrics of DESIGN.md
("Metrics, defined once") are computed from these records by ``scheduler.metrics``.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.simulator.results import EndReason, JobRecord, SlowdownSample, TimelinePoint
from scheduler.simulator.state import SimJob


def add_timeline_point(timeline: list[TimelinePoint], point: TimelinePoint) -> None:
    """Append ``point`` unless it repeats the last one (same counts); at the same instant it
    replaces the last one."""
    if timeline:
        last = timeline[-1]
        if (last.busy_gpus, last.queued, last.running, last.paused) == (
            point.busy_gpus,
            point.queued,
            point.running,
            point.paused,
        ):
            return
        if last.t_s == point.t_s:
            timeline[-1] = point
            return
    timeline.append(point)


def slowdown_sample(running: Iterable[SimJob], now: float) -> SlowdownSample | None:
    """Slow-Down of every running job (ALGORITHMS §5): (now - start + expected remaining
    time at its current speed) / solo time; a paused job's remaining time at solo speed.
    None when no job has one."""
    values = []
    for job in running:
        if job.ref_s <= 0 or job.first_start is None:
            continue
        p = job.progress_at(now)
        remaining = (1.0 - p) / job.rate if job.rate > 0 else (1.0 - p) * job.solo_s
        values.append((now - job.first_start + remaining) / job.ref_s)
    if not values:
        return None
    lo, hi = min(values), max(values)
    return SlowdownSample(now, len(values), sum(values) / len(values), lo, hi, hi - lo)


def job_record(job: SimJob) -> JobRecord:
    """The record of a job that ended (or was left unfinished)."""
    spec = job.spec
    pl = job.placement
    completed = job.reason == EndReason.COMPLETED
    finish = job.finish if completed else None
    start = job.first_start
    run = finish - start if finish is not None and start is not None else None
    solo = job.ref_s if pl is not None else None
    location = ""
    if pl is not None:
        location = "+".join(
            f"{part.node}/" + (",".join(map(str, part.gpu_indices)) or "cpu") for part in pl.parts
        )
    slowdown = run / solo if run is not None and solo else None
    return JobRecord(
        job_id=spec.id,
        name=spec.name,
        job_type=spec.job_type,
        gpus=spec.gpus,
        arrival_s=spec.arrival_s,
        start_s=start,
        finish_s=finish,
        end_s=job.finish,
        end_reason=str(job.reason),
        location=location,
        nodes=len(pl.parts) if pl is not None else 0,
        gpu_model=job.model if pl is not None else None,
        mode=(str(pl.mode) if pl.gpu_indices else "cpu") if pl is not None else None,
        solo_s=solo,
        jct_s=finish - spec.arrival_s if finish is not None else None,
        queue_s=start - spec.arrival_s if start is not None else None,
        run_s=run,
        slowdown=slowdown,
        speedup=1.0 / slowdown if slowdown else None,
        oom_count=job.oom_count,
        restarts=job.restarts,
        preemptions=job.preemptions,
        paused_s=job.paused_total,
        explanation=job.explanation or job.waiting,
    )
