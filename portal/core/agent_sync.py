"""The portal's side of the node protocol (``workers.protocol``; docs/reliability.md).

``agent_sync(request)`` is what a node agent's sync does to the database, in one transaction on
the node's row (so syncs of one node, and the lost-node check, are serialised):

1. **order**: a request older than the newest applied one (``seq``) is refused
   (``resync_from``): a delayed request never undoes a newer one;
2. **lease**: renewed (``COSCHED_LEASE_S`` from now); a DOWN node is UP again;
3. **results** (``AttemptResult``): recorded on the attempt's part exactly once
   (``reported_at``, a conditional update; a repeat is only acknowledged). For the job's current
   attempt it decides the job: exit 0 (every rank) -> COMPLETED, another exit -> FAILED, a
   launch failure -> FAILED, over its time limit -> FAILED (reason "time limit"), stopped /
   lease run out / lost -> back to PENDING. A result of a
   superseded attempt only lands on that attempt's row and the timeline;
4. **running** (``RunningAttempt``): a part reported for the first time has started; when every
   part of the attempt has, the job goes SCHEDULED -> RUNNING;
5. **absent**: a part this node was offered and does not list (running or ended) does not run
   there: the request is newer than the reply that offered it, and the agent acts on a reply
   before its next request. An unstarted one is simply offered again; a started one is lost
   (the job is requeued); one of an ended attempt is settled;
6. **desired**: the active attempts with a part on this node. A part not yet started is
   launchable only once every part of the job's earlier attempts is settled (ended and known
   not to run), so two attempts of one job never run at once.

After the transaction: metric samples and log tails (best effort: Redis may be down; the lease
must not depend on it), then the outbox relay if anything is due.

``InProcessTransport`` serves in-process agents (the embedded default) through the same JSON
messages, without HTTP or a token.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from portal.core import adapters, observations
from portal.core.elastic import attempt_time_limit_s, regrouped_run_s
from portal.core.models import TIME_LIMIT_REASON, Gpu, Job, Node, Placement, PlacementPart
from portal.core.nodes import lease_kill_grace_s, lease_s, locked_nodes, node_register
from portal.core.oom import oom_requeue
from portal.core.outbox import emit_nudges, emit_schedule, outbox_due, outbox_relay
from portal.core.ports import master_port_assign
from portal.core.services import job_note, job_transition
from portal.core.states import PLACED, TERMINAL, IllegalTransition, JobState
from portal.core.training import training_env
from scheduler.durations import format_duration
from workers.protocol import (
    AttemptKey,
    AttemptResult,
    AttemptSpec,
    GangPart,
    ResultAck,
    ResultReport,
    RunningAttempt,
    SyncReply,
    SyncRequest,
    TransportError,
    profile_payload,
)

log = logging.getLogger(__name__)

# Syncs retry the outbox relay (messages the broker refused) at most this often per process.
RELAY_CHECK_EVERY_S = 1.0
_last_relay_check = -float("inf")


def sync_interval_s() -> float:
    return float(settings.COSCHED["SYNC_INTERVAL_S"])


def stop_grace_s() -> float:
    """SIGTERM to SIGKILL when a node stops a job (preemption, cancel, time limit)."""
    return max(0.0, float(settings.COSCHED.get("STOP_GRACE_S", 10.0)))


def _reply(node: str, **kw: Any) -> SyncReply:
    return SyncReply(
        node=node,
        lease_s=lease_s(),
        lease_kill_grace_s=lease_kill_grace_s(),
        sync_interval_s=sync_interval_s(),
        stop_grace_s=stop_grace_s(),
        **kw,
    )


@dataclass
class _Effects:
    """What the transaction decided that is done after it commits."""

    tails: dict[int, str]
    samples: list[Any]
    # per-attempt samples of current attempts (GPU readings, progress): portal.core.observations
    job_samples: list[Any] = field(default_factory=list)


def agent_sync(request: SyncRequest) -> SyncReply:
    """Apply one sync of node ``request.node`` (already authenticated) and answer it; see the
    module docstring."""
    now = timezone.now()
    with transaction.atomic():
        node = locked_nodes().filter(name=request.node).first()
        if node is None:
            if request.info is None:
                return _reply(request.node, version=request.version, send_info=True)
            _register(request)
            node = locked_nodes().get(name=request.node)
        elif request.seq <= node.sync_seq:
            log.warning(
                "node %s: request %d is older than %d, the newest applied; refused",
                node.name,
                request.seq,
                node.sync_seq,
            )
            return _reply(request.node, version=request.version, resync_from=node.sync_seq + 1)
        elif request.info is not None:
            _register(request)
        _renew(node, request, now)
        effects = _Effects(tails={}, samples=[])
        acked = _apply_reports(node, request, now, effects)
        desired = _desired(node, now)
    _after(node, effects)
    return _reply(
        node.name,
        version=request.version,  # answered in the agent's own protocol version
        acked=tuple(acked),
        desired=tuple(desired),
        drop_checkpoints=checkpoints_to_drop(request.checkpoints, now),
    )


def checkpoints_to_drop(job_ids: tuple[int, ...], now: datetime) -> tuple[int, ...]:
    """Of the jobs whose checkpoint directory a node keeps (and runs no attempt of), those it
    may delete: ended at least ``COSCHED_CHECKPOINT_KEEP_S`` ago, or no longer known (deleted).
    A job still pending or running keeps its checkpoint: it may resume from it."""
    keep_s = float(settings.COSCHED.get("CHECKPOINT_KEEP_S", 7 * 24 * 3600.0))
    if not job_ids or keep_s < 0:
        return ()
    cutoff = now - timedelta(seconds=keep_s)
    keep = set(
        Job.objects.filter(pk__in=set(job_ids))
        .exclude(state__in=list(TERMINAL), finished_at__lte=cutoff)
        .exclude(state__in=list(TERMINAL), finished_at__isnull=True)
        .values_list("pk", flat=True)
    )
    return tuple(sorted(set(job_ids) - keep))


def agent_report_results(report: ResultReport) -> ResultAck:
    """Record results a runner sends itself (its agent did not collect them in time): each
    exactly once, with the same effect on the job as from a sync. No lease, no order, nothing
    inferred from what the report lacks. Returns every result's key (recorded now or before)."""
    now = timezone.now()
    effects = _Effects(tails={}, samples=[])
    with transaction.atomic():
        node = locked_nodes().filter(name=report.node).first()
        if node is None:
            return ResultAck(acked=(), version=report.version)
        for result in report.results:
            part = _part_of(node, result.key)
            if part is None:
                log.warning("node %s: result of unknown attempt %s", node.name, result.key)
                continue
            if result.log_tail is not None and part.placement.active:
                effects.tails[result.job_id] = result.log_tail
            _record_result(node, part, result, now)
            log.info("node %s: the runner of %s reported its result itself", node.name, result.key)
    _after(node, effects)
    return ResultAck(acked=tuple(r.key for r in report.results), version=report.version)


def _part_of(node: Node, key: AttemptKey) -> PlacementPart | None:
    return (
        PlacementPart.objects.filter(
            node=node, placement__job_id=key.job_id, placement__attempt=key.attempt
        )
        .select_related("placement", "placement__job")
        .first()
    )


def _register(request: SyncRequest) -> None:
    info = request.info
    assert info is not None
    node_register(
        request.node,
        kind=info.kind,
        cores=info.cores,
        memory_mb=info.memory_mb,
        backend=info.backend,
        gpus=[dict(g) for g in info.gpus],
        address=info.address,
        isolation=[dict(a) for a in info.isolation],
        container_runtimes=list(info.container_runtimes),
    )


def _renew(node: Node, request: SyncRequest, now: datetime) -> None:
    updates: dict[str, Any] = {
        "sync_seq": request.seq,
        "last_heartbeat": now,
        "lease_expires_at": now + timedelta(seconds=lease_s()),
        "agent_instance": request.instance,
        "agent_version": request.version,
    }
    # A node staff took down stays down while its agent syncs; only a resume brings it back.
    came_back = node.status == Node.Status.DOWN and not node.held_down
    if came_back:
        # A node staff drained (its reason kept) comes back draining, not up.
        updates["status"] = Node.Status.DRAINING if node.state_reason else Node.Status.UP
    Node.objects.filter(pk=node.pk).update(**updates)
    if came_back:
        log.info("node %s is back up", node.name)
        emit_schedule(f"node {node.name} is back")
    if node.agent_instance and node.agent_instance != request.instance:
        log.info("node %s: a new agent process (%s)", node.name, request.instance)


# --- reports --------------------------------------------------------------------------------------


def _parts_of(node: Node) -> dict[AttemptKey, PlacementPart]:
    """This node's parts that reports may be about: of active attempts, or offered and not
    settled yet."""
    parts = (
        PlacementPart.objects.filter(node=node)
        .filter(Q(placement__active=True) | Q(offered_at__isnull=False, settled_at__isnull=True))
        .select_related("placement", "placement__job")
    )
    return {AttemptKey(p.placement.job_id, p.placement.attempt): p for p in parts}


def _apply_reports(
    node: Node, request: SyncRequest, now: datetime, effects: _Effects
) -> list[AttemptKey]:
    parts = _parts_of(node)
    acked: list[AttemptKey] = []
    seen: set[AttemptKey] = set()
    for result in request.results:
        key = result.key
        seen.add(key)
        acked.append(key)
        part = parts.get(key) or _part_of(node, key)
        if part is None:
            log.warning("node %s: result of unknown attempt %s acknowledged", node.name, key)
            continue
        if result.log_tail is not None and part.placement.active:
            effects.tails[key.job_id] = result.log_tail  # the current attempt's last words
        _record_result(node, part, result, now)
    for report in request.running:
        key = report.key
        seen.add(key)
        part = parts.get(key)
        if part is not None:
            _record_running(node, part, report, now)
        # else: not an attempt of this node any more; it is not desired, so the agent stops it
    for key, part in parts.items():
        if key not in seen and part.offered_at is not None:
            _record_absent(node, part, now)
    current = {
        (p.placement.job_id, p.placement.attempt)
        for p in parts.values()
        if p.placement.active and p.reported_at is None
    }
    for tail in request.log_tails:
        if (tail.job_id, tail.attempt) in current:
            effects.tails[tail.job_id] = tail.text
    if request.log_chunks:
        from portal.core.joblogs import log_chunks_store

        # The full log, in this transaction: the agent moves on once the reply says so.
        mine = {(k.job_id, k.attempt) for k in parts}
        mine |= {
            (c.job_id, c.attempt)
            for c in request.log_chunks
            if (c.job_id, c.attempt) not in mine
            and PlacementPart.objects.filter(
                node=node, placement__job_id=c.job_id, placement__attempt=c.attempt
            ).exists()
        }
        log_chunks_store(request.log_chunks, mine)
    effects.samples = _samples(node, request, current)
    effects.job_samples = [
        s for s in request.samples if s.job_id is not None and (s.job_id, s.attempt) in current
    ]
    return acked


def _record_result(node: Node, part: PlacementPart, result: AttemptResult, now: datetime) -> None:
    """Record how a part ended (once) and, for the job's current attempt, decide the job."""
    started = None
    if result.started_at is not None:
        started = datetime.fromtimestamp(result.started_at, UTC)
    won = PlacementPart.objects.filter(pk=part.pk, reported_at__isnull=True).update(
        reported_at=now,
        settled_at=Coalesce("settled_at", now),
        started_at=Coalesce("started_at", started if started is not None else now),
        outcome=result.outcome,
        exit_code=result.exit_code,
        detail=result.detail[:4000],
        run_state="ended",
    )
    if not won:
        return  # recorded already: a repeat (the acknowledgement was lost)
    placement = part.placement
    _released_when_it_died(placement, result, now)
    job = (
        Job.objects.filter(pk=placement.job_id)
        .only(
            "id",
            "state",
            "name",
            "time_limit_s",
            "elastic_min_workers",
            "oom_with",
            "oom_requeues",
        )  # fmt: skip
        .first()
    )
    if job is None:
        return
    actor = f"node:{node.name}"
    where = f"attempt {placement.attempt} on {node.name}"
    if not placement.active or job.state not in PLACED:
        # Superseded (requeued, cancelled, lost): the job is elsewhere or done.
        job_note(job, actor=actor, message=f"{where} (no longer current) ended: {result.detail}")
        return
    rank = f" (node rank {part.node_rank})" if placement.parts.count() > 1 else ""
    if result.succeeded:
        unfinished = placement.parts.exclude(outcome="exited", exit_code=0).exists()
        if unfinished:
            return  # a gang: the job completes when every rank has
        _finish(job, JobState.COMPLETED, actor, f"{result.detail} on {node.name}", exit_code=0)
        transaction.on_commit(lambda: _observe_completion(job.pk, placement.pk))
    elif result.outcome == "exited" and (
        oom := oom_requeue(job, placement, result.exit_code, result.log_tail)
    ):
        # out of GPU memory beside another job on a shared GPU: back to the queue, kept away
        # from what it died beside (portal.core.oom)
        message = oom.pop("message")
        _finish(job, JobState.PENDING, actor, f"{where}{rank}: {message}", **oom)
    elif result.outcome == "exited":
        _finish(
            job,
            JobState.FAILED,
            actor,
            f"{result.detail} on {node.name}{rank}",
            exit_code=result.exit_code,
            failure_reason=f"{result.detail}{rank}",
        )
    elif result.outcome == "time_limit":
        _finish(
            job,
            JobState.FAILED,
            actor,
            f"{result.detail} on {node.name}{rank}",
            exit_code=result.exit_code,
            failure_reason=_time_limit_reason(job, placement.attempt, result.detail) + rank,
        )
    elif result.outcome == "launch_failed":
        _finish(
            job, JobState.FAILED, actor, result.detail, exit_code=None, failure_reason=result.detail
        )
    else:
        _finish(job, JobState.PENDING, actor, f"{where}{rank} ended: {result.detail}")
    emit_nudges({p.node.name for p in placement.parts.all()} - {node.name}, f"job {job.pk} ended")
    emit_schedule(f"job {job.pk} finished")


def _released_when_it_died(placement: Placement, result: AttemptResult, now: datetime) -> None:
    """An attempt ended by the portal (preempted, cancelled, requeued) was marked released when
    the portal decided it; its processes died later (SIGTERM, the grace, SIGKILL, the runner's
    sweep of what was left). The runner's ``ended_at`` is when its last process died: the
    attempt's end moves there (never past now, never before the decision)."""
    died = min(datetime.fromtimestamp(result.ended_at, UTC), now)
    Placement.objects.filter(pk=placement.pk, active=False, released_at__lt=died).update(
        released_at=died
    )


def _time_limit_reason(job: Job, attempt: int, detail: str) -> str:
    """``Job.failure_reason`` of a job stopped at its time limit: it begins "time limit". The
    runner knows only its attempt's share of an elastic job's limit; the reason names the
    job's limit and the regrouped attempts it was counted over."""
    _, regrouped = regrouped_run_s(job.pk, attempt) if job.elastic_min_workers else (0.0, 0)
    if regrouped and job.time_limit_s:
        return (
            f"{TIME_LIMIT_REASON} {format_duration(job.time_limit_s)} reached over attempts "
            f"{attempt - regrouped}-{attempt} (an elastic job's regroups do not restart it): "
            "the runner stopped the job"
        )
    if detail.startswith(TIME_LIMIT_REASON):
        return detail
    return f"{TIME_LIMIT_REASON}: {detail}"


def _observe_completion(job_id: int, placement_id: int) -> None:
    try:
        observations.close_and_complete(job_id, placement_id)
    except Exception as exc:  # what was learned is a convenience: never fail the sync for it
        log.warning("job %s: completion not observed: %s", job_id, exc)


def _finish(job: Job, target: JobState, actor: str, message: str, **fields: Any) -> None:
    """Move the job to ``target`` from wherever it is in PLACED, through RUNNING when the state
    machine needs it (a job that ends before its start or its resume was recorded)."""
    state = JobState(job.state)
    try:
        if target == JobState.COMPLETED and state in (JobState.SCHEDULED, JobState.PAUSED):
            note = (
                "the process ended while paused"
                if state == JobState.PAUSED
                else "the process ended before its start was recorded"
            )
            job_transition(job, JobState.RUNNING, actor=actor, message=note, expected=state)
            state = JobState.RUNNING
        job_transition(job, target, actor=actor, message=message, expected=state, **fields)
    except IllegalTransition as exc:
        log.info("job %s: %s", job.pk, exc)


def _record_running(node: Node, part: PlacementPart, report: RunningAttempt, now: datetime) -> None:
    if part.reported_at is not None:
        return  # a stale report of an ended part
    updates: dict[str, Any] = {}
    if part.pid != report.pid and report.pid is not None:
        updates["pid"] = report.pid
    if part.run_state != report.state:
        updates["run_state"] = report.state
    first = part.started_at is None
    if first:
        updates["started_at"] = now
        updates["offered_at"] = part.offered_at or now
    if updates:
        PlacementPart.objects.filter(pk=part.pk).update(**updates)
    placement = part.placement
    if not first or not placement.active:
        return
    if placement.job.state not in (JobState.SCHEDULED, JobState.RUNNING):
        return
    parts = list(placement.parts.select_related("node").order_by("node_rank"))
    if any(p.started_at is None and p.pk != part.pk for p in parts):
        return  # a gang: RUNNING once every rank has started
    if placement.job.state == JobState.RUNNING:
        # an elastic job's new group (regrouped while RUNNING): it stays RUNNING
        if placement.started_at is None:
            Placement.objects.filter(pk=placement.pk).update(started_at=now)
            nodes = ", ".join(p.node.name for p in parts)
            job_note(
                placement.job,
                actor=f"node:{node.name}",
                message=f"the new group of attempt {placement.attempt} started on {nodes}",
            )
        return
    Placement.objects.filter(pk=placement.pk).update(started_at=now)
    if len(parts) == 1:
        pid = f" (pid {report.pid})" if report.pid else ""
        message = f"started on {_where(placement, parts[0])}, attempt {placement.attempt}{pid}"
    else:
        nodes = ", ".join(p.node.name for p in parts)
        message = f"all {len(parts)} ranks started on {nodes}, attempt {placement.attempt}"
    # IllegalTransition: cancelled or requeued meanwhile; the next reply does not want it
    with contextlib.suppress(IllegalTransition):
        job_transition(
            placement.job,
            JobState.RUNNING,
            actor=f"node:{node.name}",
            message=message,
            expected=JobState.SCHEDULED,
        )


def _record_absent(node: Node, part: PlacementPart, now: datetime) -> None:
    """An offered part the agent does not list does not run on the node (module docstring)."""
    if part.settled_at is not None or part.reported_at is not None:
        return
    placement = part.placement
    current = placement.active and placement.job.state in PLACED
    if current and part.started_at is None:
        return  # the offer never reached the agent (a lost reply): it is offered again
    if part.started_at is None:
        PlacementPart.objects.filter(pk=part.pk, settled_at__isnull=True).update(
            settled_at=now, detail="never started"
        )
        return
    detail = f"the agent on {node.name} no longer runs attempt {placement.attempt}"
    PlacementPart.objects.filter(pk=part.pk, reported_at__isnull=True).update(
        settled_at=now, reported_at=now, outcome="lost", detail=detail, run_state="ended"
    )
    if current:
        _finish(placement.job, JobState.PENDING, f"node:{node.name}", f"{detail} (state lost)")
        others = set(placement.parts.exclude(pk=part.pk).values_list("node__name", flat=True))
        emit_nudges(others, f"job {placement.job_id} lost on {node.name}")
        emit_schedule(f"job {placement.job_id} requeued")


def _where(placement: Placement, part: PlacementPart) -> str:
    gpus = part.gpu_indices or []
    if not gpus:
        return f"{part.node.name} (CPU, {part.cpus} cores)"
    mode = placement.sharing_mode.replace("_", "-")
    extra = f" {placement.mps_percentage}%" if placement.mps_percentage is not None else ""
    extra = f" {placement.mig_profile}" if placement.mig_profile else extra
    return f"{part.node.name} GPU {','.join(map(str, gpus))} ({mode}{extra})"


# --- desired attempts -----------------------------------------------------------------------------


def _desired(node: Node, now: datetime) -> list[AttemptSpec]:
    """The attempts this node should run now (module docstring, step 6)."""
    parts = list(
        PlacementPart.objects.filter(
            node=node,
            reported_at__isnull=True,
            placement__active=True,
            placement__job__state__in=list(PLACED),
        )
        .select_related("placement", "placement__job", "placement__job__owner")
        .order_by("placement__job_id")
    )
    if not parts:
        return []
    placements = {p.placement_id for p in parts}
    all_parts: dict[int, list[PlacementPart]] = defaultdict(list)
    for p in (
        PlacementPart.objects.filter(placement_id__in=placements)
        .select_related("node")
        .order_by("node_rank")
    ):
        all_parts[p.placement_id].append(p)
    # Only a job's later attempts can have an earlier one still running somewhere.
    launchable = [p for p in parts if p.started_at is None and p.placement.attempt > 1]
    held = _held_back({p.placement.job_id: p.placement.attempt for p in launchable})
    specs = []
    offered = []
    for part in parts:
        placement, job = part.placement, part.placement.job
        launch = part.started_at is None
        if launch and job.pk in held:
            continue  # an earlier attempt may still run somewhere: wait until it is settled
        if launch and part.offered_at is None:
            offered.append(part.pk)
        specs.append(_spec(part, placement, job, all_parts[placement.pk], launch))
    if offered:
        PlacementPart.objects.filter(pk__in=offered, offered_at__isnull=True).update(offered_at=now)
    return specs


def _held_back(attempts: dict[int, int]) -> set[int]:
    """Jobs (of ``{job: attempt}``) an earlier attempt of which is not settled yet."""
    if not attempts:
        return set()
    unsettled = PlacementPart.objects.filter(
        placement__job_id__in=list(attempts), offered_at__isnull=False, settled_at__isnull=True
    ).values_list("placement__job_id", "placement__attempt")
    return {job for job, attempt in unsettled if attempt < attempts[job]}


def _spec(
    part: PlacementPart, placement: Placement, job: Job, parts: list[PlacementPart], launch: bool
) -> AttemptSpec:
    gang = tuple(
        GangPart(
            node=p.node.name,
            node_rank=p.node_rank,
            gpu_indices=tuple(p.gpu_indices or ()),
            cpus=p.cpus,
            address=p.node.address,
        )
        for p in parts
    )
    common = {
        "job_id": job.pk,
        "attempt": placement.attempt,
        "paused": job.state == JobState.PAUSED,
        "parts": gang,
        "node_rank": part.node_rank,
        "mode": placement.sharing_mode,
        "mps_percentage": placement.mps_percentage,
        "mig_profile": placement.mig_profile or None,
        # an elastic job's workers are its GPUs: one process (rank) per GPU (docs/elastic.md)
        "process_per_gpu": job.elastic_min_workers is not None and bool(part.gpu_indices),
    }
    if not launch:
        # It runs: the agent has its spec on disk and needs only the pause flag.
        return AttemptSpec(launch=False, command="", **common)
    if len(parts) > 1 or common["process_per_gpu"]:
        common["master_port"] = master_port_assign(placement)
    profile = None
    if job.profile_id is not None:
        profile = profile_payload(adapters.profile_to_domain(job.profile))
    gpu_model = None
    if part.gpu_indices:
        gpu_model = (
            Gpu.objects.filter(node_id=part.node_id, index=part.gpu_indices[0])
            .values_list("model", flat=True)
            .first()
        )
    return AttemptSpec(
        launch=True,
        command=job.command,
        gpu_model=gpu_model,
        profile=profile,
        job_name=job.name,
        job_kind=job.kind,
        job_type=(job.params or {}).get("job_type") if isinstance(job.params, dict) else None,
        gpu_memory_mb=float(job.gpu_memory_mb) if job.gpu_memory_mb else None,
        owner=job.owner.get_username(),  # the node maps it to a unix account (isolation)
        memory_mb=job.memory_mb or None,
        time_limit_s=attempt_time_limit_s(job, placement.attempt),
        env={**training_env(job.pk, placement.attempt), **_job_control_env(job)},
        container_image=(job.container_image or "").strip(),
        **common,
    )


def _job_control_env(job: Job) -> dict[str, str]:
    """An array task's index and array (``COSCHED_ARRAY_TASK_ID``, ``COSCHED_ARRAY_JOB_ID``)
    and where the runner writes its output (``COSCHED_OUTPUT`` / ``COSCHED_ERROR``: the job's
    patterns with %j, %a, %u filled in; docs/job-control.md)."""
    from portal.core.jobcontrol import expand_path

    env: dict[str, str] = {}
    if job.array_of_id is not None:
        env["COSCHED_ARRAY_JOB_ID"] = str(job.array_of_id)
        env["COSCHED_ARRAY_TASK_ID"] = str(job.array_index)
    user = job.owner.get_username()
    for name, pattern in (("COSCHED_OUTPUT", job.output_path), ("COSCHED_ERROR", job.error_path)):
        if pattern:
            env[name] = expand_path(pattern, job_id=job.pk, user=user, array_index=job.array_index)
    return env


# --- after the transaction ------------------------------------------------------------------------


def _samples(node: Node, request: SyncRequest, current: set[tuple[int, int]]) -> list[Any]:
    from portal.core.metrics import Sample

    if not request.samples:
        return []
    gpu_ids = dict(Gpu.objects.filter(node=node).values_list("index", "pk"))
    out = []
    for s in request.samples:
        at = datetime.fromtimestamp(s.at, UTC)
        job_id = None
        if s.job_id is not None:
            if (s.job_id, s.attempt) not in current:
                continue  # a superseded attempt's figures are not the job's
            job_id = s.job_id
        gpu_id = None
        if s.gpu_index is not None:
            gpu_id = gpu_ids.get(s.gpu_index)
            if gpu_id is None:
                continue
        out.append(Sample(s.metric, s.value, at, gpu_id=gpu_id, node_id=node.pk, job_id=job_id))
    return out


def _after(node: Node, effects: _Effects) -> None:
    """Metrics, log tails and the outbox relay: best effort, after the lease was renewed."""
    from portal.core.metrics import log_tails_store, metrics_record

    try:
        if effects.samples:
            metrics_record(effects.samples)
    except Exception as exc:
        log.warning("node %s: metrics not recorded: %s", node.name, exc)
    try:
        if effects.job_samples:
            observations.record_job_samples(node, effects.job_samples)
    except Exception as exc:
        log.warning("node %s: GPU readings and progress not recorded: %s", node.name, exc)
    try:
        log_tails_store(effects.tails)
    except Exception as exc:
        log.warning("node %s: log tails not stored: %s", node.name, exc)
    global _last_relay_check
    now = time.monotonic()
    if now - _last_relay_check < RELAY_CHECK_EVERY_S:
        return
    _last_relay_check = now
    try:
        if outbox_due():
            outbox_relay()
    except Exception as exc:
        log.warning("outbox relay after a sync failed: %s", exc)


# --- in-process transport -------------------------------------------------------------------------


class InProcessTransport:
    """A ``workers.protocol.Transport`` for agents living in the portal's process (the
    embedded default): the request and the reply go through their JSON form, as over HTTP.
    ``portal_url``: the portal's own address, given to jobs for the training SDK (None: none)."""

    def __init__(self, portal_url: str | None = None) -> None:
        self.portal_url = portal_url

    def sync(self, request: SyncRequest) -> SyncReply:
        from django.db import close_old_connections

        try:
            wire = SyncRequest.from_json(request.to_json())
            reply = agent_sync(wire)
            return SyncReply.from_json(reply.to_json())
        except Exception as exc:
            close_old_connections()
            raise TransportError(f"in-process sync failed: {exc}") from exc
