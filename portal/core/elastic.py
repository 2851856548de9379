"""Elastic training on the live system (issue 17): the engine's memory on the job row, the
policy's proposals as ``ElasticChange`` rows, the job's statistics windows, and the **regroup**
that applies a change: the job's ranks are stopped and started again as a new group.

The decisions are the pure engine's (``scheduler.elastic``, used by the ``elastic`` policy);
this module stores them and carries them out. A proposal is written with ``applied=False`` and
marks the job's engine state *in transition*, so the policy proposes nothing else until it has
been carried out or refused. It is carried out at the job's next safe point: a window reported
with ``checkpointed`` (the job has saved its state). Then, in one transaction, the job's
attempt ends (outcome *regrouped*) and its next attempt is written with the new GPU set: more
GPUs, fewer, or a spare in place of a straggler's. The node agents stop the old ranks (they are
no longer desired) and, once every one of them is known to have ended, start the new group, one
process per GPU, with ``WORLD_SIZE`` / ``RANK`` / ``MASTER_ADDR`` of the new group
(``workers.agent.gang_env``, ``rank_envs``); the job resumes from its checkpoint
(``COSCHED_CHECKPOINT_DIR``). This is how an elastic launcher such as torchrun's restarts its
workers when the group changes.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from portal.core.models import ElasticChange, Gpu, Job, Placement, PlacementPart
from portal.core.services import job_note
from portal.core.states import JobState
from scheduler import elastic as engine
from scheduler.domain import Action, ActionKind
from scheduler.durations import format_duration


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
        job_note(
            job, actor=actor, message=f"{action.policy}: {change.summary()}: {action.explanation}"
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


#: The fields of a window (``POST /api/v1/training/elastic/``); the first three are required.
WINDOW_FIELDS = (
    "workers",
    "batches",
    "seconds",
    "rank_rates",
    "remaining_steps",
    "elapsed_s",
    "checkpointed",
    "local_batch",
)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def elastic_window_parse(data: Any) -> dict[str, Any]:
    """The keyword arguments of ``elastic_window_report`` from a window's JSON body; raises
    ``ElasticReportError`` naming every bad, missing or unknown field."""
    if not isinstance(data, dict):
        raise ElasticReportError({"body": ["expected a JSON object"]})
    errors: dict[str, list[str]] = {
        name: ["unknown field"] for name in set(data) - set(WINDOW_FIELDS)
    }
    for name in WINDOW_FIELDS[:3]:
        if name not in data:
            errors[name] = ["required"]
    values = {name: data[name] for name in WINDOW_FIELDS if name in data}
    values.setdefault("rank_rates", [])
    values.setdefault("remaining_steps", 0.0)
    values.setdefault("elapsed_s", 0.0)
    values.setdefault("checkpointed", False)
    values.setdefault("local_batch", None)
    if not any(name in errors for name in WINDOW_FIELDS[:3]):
        errors.update(_window_errors(**values))
    if errors:
        raise ElasticReportError(errors)
    return values


def _window_errors(
    workers: Any,
    batches: Any,
    seconds: Any,
    rank_rates: Any,
    remaining_steps: Any,
    elapsed_s: Any = 0.0,
    checkpointed: Any = False,
    local_batch: Any = None,
) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    if local_batch is not None and (
        not isinstance(local_batch, int)
        or isinstance(local_batch, bool)
        or not 1 <= local_batch <= 10**7
    ):
        errors["local_batch"] = ["must be a whole number of samples between 1 and 10^7"]
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= 4096:
        errors["workers"] = ["must be a whole number between 1 and 4,096"]
    if not isinstance(batches, int) or isinstance(batches, bool) or not 1 <= batches <= 10**9:
        errors["batches"] = ["must be a whole number between 1 and 10^9"]
    if not _number(seconds) or not 0 < seconds < 10**7:
        errors["seconds"] = ["must be a positive number of seconds"]
    if not _number(remaining_steps) or not 0 <= remaining_steps < 10**15:
        errors["remaining_steps"] = ["must be a non-negative number"]
    if not _number(elapsed_s) or not 0 <= elapsed_s < 10**9:
        errors["elapsed_s"] = ["must be a non-negative number of seconds"]
    if not isinstance(checkpointed, bool):
        errors["checkpointed"] = ["must be true or false"]
    if not isinstance(rank_rates, list | tuple) or not all(
        _number(r) and 0 <= r < 10**12 for r in rank_rates
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
    checkpointed: bool = False,
    local_batch: int | None = None,
) -> dict[str, Any]:
    """Fold one statistics window (every 10 mini-batches) of a running elastic job into its
    engine state, and carry out a proposed change at this safe point (ALGORITHMS.md §6).

    ``workers``: the count the window ran at (the ranks of the job's current attempt).
    ``local_batch``: the samples per rank in each of the window's mini-batches, when the job
    follows the answer's ``local_batch`` (a maximum global batch); the engine then counts in
    mini-batches of the job's reference size (its profile's batch size, else its maximum global
    batch), so counts with different local batches compare (``engine.reference_units``).
    ``checkpointed``: the job saved its state after this window, so it may be regrouped now;
    a proposed change is then applied (the next attempt is written: module docstring) or
    refused (no idle GPU left for it). Returns ``{"workers": the count to run with,
    "replace_ranks": ranks to be replaced, "local_batch": ..., "explanation": the change's
    reason, "regroup": True when this attempt is over (wait to be stopped, resume in the next
    one), "attempt": the next attempt's number or None}``. Raises ``ElasticReportError`` (per
    field) for a bad window, a job that is not elastic or not running, or a count that is not
    the attempt's.
    """
    errors = _window_errors(
        workers,
        batches,
        seconds,
        list(rank_rates),
        remaining_steps,
        elapsed_s,
        checkpointed,
        local_batch,
    )
    spec = engine.elastic_job_of(_spec_of(job))
    if spec is None:
        errors.setdefault("job", []).append("is not elastic (no elastic_min/max_workers)")
    if errors or spec is None:
        raise ElasticReportError(errors)
    regroup: Placement | None = None
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.state != JobState.RUNNING:
            raise ElasticReportError({"job": [f"is {job.state}, not RUNNING"]})
        placement = Placement.objects.filter(job=job, active=True).first()
        held = placement.gpus.count() if placement is not None else 0
        if held and workers != held:
            raise ElasticReportError(
                {"workers": [f"attempt {placement.attempt} runs {held} workers, not {workers}"]}
            )
        state = engine.state_from_dict(job.elastic_state)
        if state is None:
            state = engine.start(spec, workers, remaining_steps)
        elif state.workers != workers:
            # placed again by the scheduler (requeued) at another count: measure it afresh
            state = engine.changed(state, workers, f"placed again at {workers} workers")
        pending = job.elastic_changes.filter(applied=False, refused="").order_by("-id").first()
        if pending is not None and placement is not None and pending.at < placement.created_at:
            _refuse(job, pending, "the job was placed again before it could be applied")
            state, pending = engine.end_transition(state), None
        seconds, remaining_steps = engine.reference_units(
            spec, seconds, remaining_steps, local_batch
        )
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
        if pending is not None and checkpointed and placement is not None:
            regroup, refusal = _regroup(job, placement, pending)
            if regroup is None:
                _refuse(job, pending, refusal)
                state = engine.end_transition(state)
            else:
                state = engine.regrouped(state, pending.workers_to, pending.ranks or [])
        elif pending is None and engine.decide(state, spec, config).kind != "hold":
            # a decision is due: run a cycle now rather than at the next periodic one
            from portal.core.outbox import emit_schedule

            emit_schedule(f"job {job.pk}: elastic decision due")
        job.elastic_state = engine.state_to_dict(state)
        job.save(update_fields=["elastic_state"])
    if pending is not None and pending.refused:
        pending = None
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
        "regroup": regroup is not None,
        "attempt": None if regroup is None else regroup.attempt,
    }


def _refuse(job: Job, change: ElasticChange, why: str) -> None:
    change.refused = why[:500]
    change.save(update_fields=["refused"])
    job_note(job, actor="elastic", message=f"{change.summary()} not applied: {why}")


def _regroup(job: Job, placement: Placement, change: ElasticChange) -> tuple[Placement | None, str]:
    """Carry out ``change`` (module docstring): end ``placement`` (outcome *regrouped*) and
    write the job's next attempt with the new GPU set. Returns (the new attempt, "") or (None,
    why it cannot be done now)."""
    placement = Placement.objects.select_for_update().get(pk=placement.pk)
    if job.time_limit_s:  # first: nothing else to look at when the run is over
        used, _ = regrouped_run_s(job.pk, placement.attempt)
        if placement.started_at is not None:
            used += (timezone.now() - placement.started_at).total_seconds()
        if used >= job.time_limit_s:
            return None, (
                f"the job's time limit ({format_duration(job.time_limit_s)}, counted across "
                f"its regroups) is reached"
            )
    parts = list(placement.parts.select_related("node").order_by("node_rank"))
    by_key = {
        (g.node_id, g.index): g
        for g in Gpu.objects.filter(placements=placement).select_related("node")
    }
    held = [
        by_key[(p.node_id, i)] for p in parts for i in p.gpu_indices if (p.node_id, i) in by_key
    ]
    if not held:
        return None, "the attempt holds no GPU"
    model = held[0].model
    own = [p.node_id for p in parts]
    busy = Gpu.objects.filter(placements__active=True).values_list("pk", flat=True)
    idle = list(
        Gpu.objects.select_for_update(of=("self",))
        .filter(model=model, node__status="up")
        .exclude(pk__in=list(busy))
        .select_related("node")
    )
    idle.sort(
        key=lambda g: (
            g.node_id not in own,
            own.index(g.node_id) if g.node_id in own else 0,
            g.node.name,
            g.index,
        )
    )
    if change.kind == ElasticChange.Kind.SCALE:
        target = change.workers_to
        if target > len(held):
            need = target - len(held)
            if len(idle) < need:
                return None, f"only {len(idle)} idle {model} GPU(s), {need} needed"
            late = _waiting_since(change, model, job.pk, len(idle) - need)
            if late is not None:
                return None, (
                    f"job {late} started waiting for {model} GPUs after this step up was "
                    f"proposed and would not fit beside it; the policy decides again with it"
                )
            new = held + idle[:need]
        else:
            new = held[:target]  # the last ranks leave; rank 0 stays
    else:
        new = list(held)
        for rank in change.ranks or []:
            if not 0 <= rank < len(new):
                return None, f"rank {rank} is not in the group of {len(new)}"
            spares = [g for g in idle if g not in new]
            if not spares:
                return None, f"no idle {model} GPU to replace rank {rank} with"
            near = [g for g in spares if g.node_id == new[rank].node_id]
            new[rank] = (near or spares)[0]
    nodes: list[Any] = []
    for gpu in new:
        if gpu.node not in nodes:
            nodes.append(gpu.node)
    now = timezone.now()
    attempt = placement.attempt + 1  # the active attempt is the job's latest
    where = ", ".join(f"{g.node.name}/{g.index}" for g in new)
    Placement.objects.filter(pk=placement.pk).update(
        active=False,
        released_at=now,
        outcome=Placement.Outcome.REGROUPED,
        end_reason=f"regrouped into attempt {attempt} ({change.summary()}): {change.reason}"[:4000],
    )
    parts_by_node = {p.node_id: p for p in parts}
    successor = Placement.objects.create(
        job=job,
        attempt=attempt,
        node=nodes[0],
        sharing_mode=placement.sharing_mode,
        gpu_memory_mb=placement.gpu_memory_mb,
        cpus=placement.cpus,
        policy=change.policy or "elastic",
        explanation=f"{change.summary()}: {change.reason}",
    )
    PlacementPart.objects.bulk_create(
        PlacementPart(
            placement=successor,
            node=node,
            node_rank=rank,
            gpu_indices=sorted(g.index for g in new if g.node_id == node.pk),
            cpus=parts_by_node[node.pk].cpus if node.pk in parts_by_node else parts[0].cpus,
        )
        for rank, node in enumerate(nodes)
    )
    successor.gpus.set(new)
    Gpu.objects.filter(pk__in=[g.pk for g in new]).update(current_mode=placement.sharing_mode)
    change.applied = True
    change.attempt = attempt
    change.gpus = where[:2000]
    change.save(update_fields=["applied", "attempt", "gpus"])
    job_note(
        job,
        actor="elastic",
        message=f"regrouped: attempt {attempt} runs {len(new)} ranks on {where} "
        f"({change.summary()}); attempt {placement.attempt}'s ranks are stopped first",
    )
    from portal.core.outbox import emit_nudges, emit_schedule

    emit_nudges({p.node.name for p in parts} | {n.name for n in nodes}, f"job {job.pk} regrouped")
    if set(held) - set(new):  # GPUs given back (a shrink, a straggler's): a waiting job may fit
        emit_schedule(f"job {job.pk} released GPUs at a regroup")
    return successor, ""


def _waiting_since(change: ElasticChange, model: str, job_id: int, left: int) -> int | None:
    """A job that started waiting for GPUs after ``change`` (a step up) was proposed and needs
    more than the ``left`` idle ``model`` GPUs the step up would leave (None: none). The policy
    proposed the step up without it in view (its yield to the queue keeps step-ups off a
    model a job waits for); carried out now, the step up would take the GPUs it waits for."""
    late = (
        Job.objects.filter(state=JobState.PENDING, gpus__gt=left)
        .exclude(pk=job_id)
        .filter(
            Q(submitted_at__gt=change.at)
            | Q(events__to_state=JobState.PENDING, events__at__gt=change.at)
        )
        .select_related("profile")
        .prefetch_related("profile__gpu_times")
        .distinct()
        .order_by("pk")
    )
    for waiting in late:
        times = {} if waiting.profile is None else {
            t.gpu_model: t.time_s for t in waiting.profile.gpu_times.all()
        }  # fmt: skip
        if not times or times.get(model, 0) > 0:  # it may run on this model
            return waiting.pk
    return None


def regrouped_run_s(job_id: int, attempt: int) -> tuple[float, int]:
    """Seconds the job ran in the regrouped attempts just before ``attempt``, and how many
    there were. A regroup is no restart: one run of an elastic job is the unbroken chain of
    attempts that ended *regrouped*, and its time limit counts that whole chain (wall time from
    each attempt's start to its regroup, pauses included). An attempt that ended otherwise
    (requeued, preempted) starts a new run, as for every job."""
    total, count = 0.0, 0
    rows = (
        Placement.objects.filter(job_id=job_id, attempt__lt=attempt)
        .order_by("-attempt")
        .values_list("outcome", "started_at", "released_at")
    )
    for outcome, started, released in rows:
        if outcome != Placement.Outcome.REGROUPED:
            break
        count += 1
        if started is not None and released is not None:
            total += max(0.0, (released - started).total_seconds())
    return total, count


def attempt_time_limit_s(job: Job, attempt: int) -> float | None:
    """The time limit the runner enforces for ``attempt`` of ``job``: the job's limit less what
    the regrouped attempts before it ran (``regrouped_run_s``); None when the job has none. At
    least one second: a group started with nothing left stops at once with outcome
    ``time_limit`` (``_regroup`` refuses a regroup past the limit, so this is a race's floor)."""
    if not job.time_limit_s:
        return None
    limit = float(job.time_limit_s)
    if job.elastic_min_workers is None or attempt <= 1:
        return limit
    used, _ = regrouped_run_s(job.pk, attempt)
    return max(1.0, limit - used)


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
