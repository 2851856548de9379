"""Elastic training on the live system (issue 17): the engine's memory on the job row, the
policy's proposals as ``ElasticChange`` rows, and the job page's view of them.

The decisions are the pure engine's (``scheduler.elastic``, used by the ``elastic`` policy);
this module only stores and reads them. A proposal is written with ``applied=False`` and marks
the job's engine state *in transition*, so the policy proposes nothing else until the job has
taken the change (``elastic_change_applied``) at a safe point.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from portal.core.models import ElasticChange, Job, JobEvent
from portal.core.states import JobState
from scheduler import elastic as engine
from scheduler.domain import Action, ActionKind


def elastic_change_propose(job_id: int, action: Action, *, actor: str) -> ElasticChange | None:
    """Record a ``SET_WORKERS`` or ``REPLACE_WORKERS`` action of the policy (None: the job is
    no longer running, or already has a change under way)."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        if job is None or job.state != JobState.RUNNING:
            return None
        state = engine.state_from_dict(job.elastic_state)
        if state is None or state.in_transition:
            return None
        value: Any = action.value
        if action.kind == ActionKind.SET_WORKERS:
            change = ElasticChange(
                job=job,
                kind=ElasticChange.Kind.SCALE,
                workers_from=int(value.get("workers_from", state.workers)),
                workers_to=int(value["workers"]),
                efficiency=value.get("efficiency"),
                local_batch=value.get("local_batch") or None,
            )
        else:
            change = ElasticChange(
                job=job,
                kind=ElasticChange.Kind.REPLACE,
                workers_from=state.workers,
                workers_to=state.workers,
                ranks=[int(r) for r in value or ()],
            )
        change.reason = action.explanation
        change.policy = action.policy
        change.save()
        job.elastic_state = engine.state_to_dict(engine.begin_transition(state))
        job.save(update_fields=["elastic_state"])
        JobEvent.objects.create(
            job=job,
            from_state=job.state,
            to_state=job.state,
            actor=actor,
            message=f"{action.policy}: {change.summary()}: {action.explanation}",
        )
    return change


def elastic_changes(job: Job) -> list[ElasticChange]:
    """The job's worker-count changes and replacements, oldest first."""
    return list(job.elastic_changes.all())


class ElasticReportError(ValueError):
    """A window report the engine cannot use; ``errors`` maps each bad field to its reasons."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{k}: {', '.join(v)}" for k, v in errors.items()))
        self.errors = errors


def _window_errors(
    workers: Any, batches: Any, seconds: Any, rank_rates: Any, remaining_steps: Any
) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}

    def number(value: Any) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool) and value == value

    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= 4096:
        errors["workers"] = ["must be a whole number between 1 and 4,096"]
    if not isinstance(batches, int) or isinstance(batches, bool) or not 1 <= batches <= 10**9:
        errors["batches"] = ["must be a whole number between 1 and 10^9"]
    if not number(seconds) or not 0 < seconds < 10**7:
        errors["seconds"] = ["must be a positive number of seconds"]
    if not number(remaining_steps) or not 0 <= remaining_steps < 10**15:
        errors["remaining_steps"] = ["must be a non-negative number"]
    if not isinstance(rank_rates, list | tuple) or not all(
        number(r) and 0 <= r < 10**12 for r in rank_rates
    ):
        errors["rank_rates"] = ["must be a list of non-negative numbers, one per rank"]
    elif "workers" not in errors and rank_rates and len(rank_rates) != workers:
        errors["rank_rates"] = [f"has {len(rank_rates)} entries for {workers} workers"]
    return errors


def elastic_window_report(
    job: Job,
    *,
    workers: int,
    batches: int,
    seconds: float,
    rank_rates: list[float] | tuple[float, ...] = (),
    remaining_steps: float = 0.0,
    elapsed_s: float = 0.0,
    replaced_ranks: list[int] | tuple[int, ...] = (),
) -> dict[str, Any]:
    """Fold one statistics window (every 10 mini-batches) of a running elastic job into its
    engine state, and tell the job what to run with (ALGORITHMS.md §6, issue 17).

    ``workers``: the count the window ran at. A proposed scale change is *applied* when the
    job reports a window at its new count; a proposed replacement when the job reports the
    ranks it swapped (``replaced_ranks``). Returns ``{"workers": target count, "replace_ranks":
    [ranks to swap], "local_batch": ..., "explanation": ...}``: the job changes at its next safe
    point. Raises ``ElasticReportError`` (per field) for a bad window, or a job that is not
    elastic or not running.
    """
    errors = _window_errors(workers, batches, seconds, list(rank_rates), remaining_steps)
    spec = engine.elastic_job_of(_spec_of(job))
    if spec is None:
        errors.setdefault("job", []).append("is not elastic (no elastic_min/max_workers)")
    if errors or spec is None:
        raise ElasticReportError(errors)
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.state != JobState.RUNNING:
            raise ElasticReportError({"job": [f"is {job.state}, not RUNNING"]})
        state = engine.state_from_dict(job.elastic_state) or engine.start(
            spec, workers, remaining_steps
        )
        pending = job.elastic_changes.filter(applied=False).order_by("-id").first()
        if pending is not None:
            done = (pending.kind == ElasticChange.Kind.SCALE and workers == pending.workers_to) or (
                pending.kind == ElasticChange.Kind.REPLACE
                and set(pending.ranks or []) <= {int(r) for r in replaced_ranks}
            )
            if done:
                pending.applied = True
                pending.save(update_fields=["applied"])
                if pending.kind == ElasticChange.Kind.SCALE:
                    state = engine.changed(state, workers)
                    note = _resize_placement(job, workers)
                    if note:
                        JobEvent.objects.create(
                            job=job,
                            from_state=job.state,
                            to_state=job.state,
                            actor="elastic",
                            message=f"now {workers} workers: {note}",
                        )
                else:
                    state = engine.replaced(state, pending.ranks or [])
                pending = None
        if workers == state.workers:
            window = engine.Window(
                workers,
                batches,
                float(seconds),
                tuple(float(r) for r in rank_rates),
                float(remaining_steps),
                float(elapsed_s),
            )
            config = _active_config()
            state = engine.observe(state, window, config)
            if pending is None and engine.decide(state, spec, config).kind != "hold":
                # a decision is due: run a cycle now rather than at the next periodic one
                from portal.core.outbox import emit_schedule

                emit_schedule(f"job {job.pk}: elastic decision due")
        job.elastic_state = engine.state_to_dict(state)
        job.save(update_fields=["elastic_state"])
    if pending is not None and pending.kind == ElasticChange.Kind.SCALE:
        target, ranks = pending.workers_to, []
    elif pending is not None:
        target, ranks = state.workers, list(pending.ranks or [])
    else:
        target, ranks = state.workers, []
    return {
        "workers": target,
        "replace_ranks": ranks,
        "local_batch": engine.local_batch_size(target, spec.local_batch, spec.max_global_batch)
        or None,
        "explanation": "" if pending is None else pending.reason,
    }


def _resize_placement(job: Job, workers: int) -> str:
    """Make the job's active placement hold ``workers`` GPUs, so the scheduler sees the GPUs
    the job now uses as busy: idle GPUs of the same model on the job's nodes are added (its
    first node first), the last ones released when it shrinks. Returns what was done."""
    from portal.core.models import Gpu, Placement

    placement = (
        Placement.objects.select_for_update().filter(job=job, active=True).order_by("-id").first()
    )
    if placement is None:
        return ""
    held = list(placement.gpus.select_related("node").order_by("node__name", "index"))
    if not held or workers == len(held):
        return ""
    first = next((g for g in held if g.node_id == placement.node_id), held[0])
    if workers > len(held):
        parts = list(placement.parts.all())
        node_ids = [placement.node_id] + [
            p.node_id for p in parts if p.node_id != placement.node_id
        ]
        busy = Gpu.objects.filter(placements__active=True).values_list("pk", flat=True)
        idle = list(
            Gpu.objects.select_for_update()
            .filter(node_id__in=node_ids, model=first.model)
            .exclude(pk__in=list(busy))
        )
        idle.sort(key=lambda g: (node_ids.index(g.node_id), g.index))
        added = idle[: workers - len(held)]
        placement.gpus.add(*added)
        text = "reserved " + ", ".join(f"{g.node.name}/{g.index}" for g in added)
        if len(added) < workers - len(held):
            text += f" (only {len(added)} idle GPUs of {workers - len(held)} needed)"
    else:
        others = [g for g in held if g.pk != first.pk]  # rank 0's GPU stays
        released = others[len(others) - (len(held) - workers) :]
        placement.gpus.remove(*released)
        text = "released " + ", ".join(f"{g.node.name}/{g.index}" for g in released)
    now_held = list(placement.gpus.order_by("index"))
    for part in placement.parts.all():
        part.gpu_indices = [g.index for g in now_held if g.node_id == part.node_id]
        part.save(update_fields=["gpu_indices"])
    return text


def _active_config() -> engine.ElasticConfig:
    """The engine settings of the active policy when it is ``elastic`` (else the defaults);
    a window only needs the straggler average's weight from them."""
    from portal.core.models import PolicySettings

    row = PolicySettings.objects.filter(active=True, policy="elastic").first()
    params = dict(row.params or {}) if row is not None else {}
    if not params.get("scale_step_workers"):
        params.pop("scale_step_workers", None)  # 0 means "per node" to the policy
    try:
        return engine.ElasticConfig.from_params(params)
    except (TypeError, ValueError):
        return engine.ElasticConfig()


def _spec_of(job: Job) -> Any:
    from portal.core.adapters import job_to_domain

    return job_to_domain(job)
