"""The live scheduling loop's service: snapshot -> active policy -> placements, in one transaction.

``run_cycle`` is what the Celery task ``cosched.schedule_cycle`` (and the embedded loop) calls:

1. lock the active ``PolicySettings`` row (``SELECT ... FOR UPDATE``): cycles are serialised
   across every scheduler worker, so a second worker waits and then sees the first one's
   placements; a process-local lock does the same for threads (and for SQLite, which ignores
   ``FOR UPDATE``);
2. read a consistent snapshot with a handful of bulk queries and turn it into
   ``scheduler.domain`` types (``portal.core.snapshot``; the policy never sees a Django object);
3. run the policy (pure, seeded);
4. write its decisions: a conditional PENDING -> SCHEDULED transition per job, a ``Placement``
   row (the job's next **attempt**, numbered) with the explanation and one ``PlacementPart`` per
   node, each GPU's sharing mode; a decision that would over-commit GPU memory or cores on any
   of its nodes (a policy bug) is refused and logged, not written: a gang is written whole or
   not at all;
5. apply its actions (pause / resume / requeue) as transitions with the policy's explanation on
   the timeline;
6. in the same transaction, queue a nudge (``portal.core.outbox``) to every node whose desired
   attempts changed; after commit the relay sends them, and each node's agent syncs and starts,
   stops, pauses or resumes what changed. Nothing depends on the nudges arriving: agents sync
   periodically anyway.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from portal.core import training
from portal.core.models import Gpu, Job, JobEvent, Placement, PlacementPart, PolicySettings
from portal.core.outbox import emit_nudges
from portal.core.policy_settings import validate_policy_settings
from portal.core.prometheus import observe_decision_latency
from portal.core.services import job_cancel, job_nodes, job_preempt, job_transition
from portal.core.snapshot import Snapshot, build_snapshot
from portal.core.states import IllegalTransition, JobState
from scheduler.domain import (
    Action,
    ActionKind,
    ClusterState,
    Decision,
    JobSpec,
    SharingMode,
)
from scheduler.domain import Placement as DomainPlacement
from scheduler.policies.registry import build_policy

log = logging.getLogger(__name__)

_CYCLE_LOCK = threading.RLock()


@dataclass
class CycleResult:
    """What one cycle did, for the task's log line, the benchmarks and the tests."""

    policy: str = ""
    fallback: str = ""  # what ran instead of ``policy`` when it failed (issue 18)
    pending: int = 0
    placed: list[int] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    actions: list[tuple[str, int]] = field(default_factory=list)
    waiting: int = 0
    seconds: float = 0.0
    policy_seconds: float = 0.0

    def summary(self) -> str:
        name = f"{self.policy} (failed; ran {self.fallback})" if self.fallback else self.policy
        return (
            f"{name}: {len(self.placed)} placed of {self.pending} pending, "
            f"{len(self.actions)} actions, {len(self.refused)} refused, "
            f"{self.seconds * 1000:.1f} ms ({self.policy_seconds * 1000:.1f} ms in the policy)"
        )


# ---------------------------------------------------------------------------------------------
# Writing a plan


@dataclass
class _Ledger:
    """Resources already committed, updated as this cycle writes placements (a second check
    beside the policy's own, so a faulty policy cannot over-commit a GPU or a node)."""

    gpu_free_mb: dict[int, float]
    gpu_mode: dict[int, str | None]
    gpu_jobs: dict[int, int]
    node_free_cores: dict[int, int]
    node_free_memory: dict[int, float | None]


def _ledger(snapshot: Snapshot) -> _Ledger:
    ledger = _Ledger({}, {}, {}, {}, {})
    for node in snapshot.state.nodes:
        ledger.node_free_cores[snapshot.node_ids[node.name]] = node.free_cores
        ledger.node_free_memory[snapshot.node_ids[node.name]] = node.free_memory_mb
        for g in node.gpus:
            gid = snapshot.gpu_ids[(node.name, g.index)]
            ledger.gpu_free_mb[gid] = g.free_memory_mb
            ledger.gpu_mode[gid] = None if g.mode is None else g.mode.value
            ledger.gpu_jobs[gid] = len(g.job_ids)
    return ledger


def _refusal(decision: Decision, job: JobSpec, snapshot: Snapshot, ledger: _Ledger) -> str | None:
    """Why writing ``decision`` would break an invariant on any of its nodes, or None if every
    part is sound (a gang is checked whole: all its parts or nothing)."""
    p = decision.placement
    need = job.memory_need_mb()
    seen_nodes: set[str] = set()
    for part in p.parts:
        if part.node in seen_nodes:
            return f"node {part.node} appears twice in one placement"
        seen_nodes.add(part.node)
        node_id = snapshot.node_ids.get(part.node)
        if node_id is None:
            return f"unknown node {part.node!r}"
        node = snapshot.state.node(part.node)
        if not node.up:
            return f"node {part.node} is down"
        free_cores = ledger.node_free_cores.get(node_id, 0)
        if part.cpus > free_cores:
            return f"node {part.node} has {free_cores} free cores, {part.cpus} asked"
        free_memory = ledger.node_free_memory.get(node_id)
        if free_memory is not None and job.memory_mb > free_memory + 1e-6:
            return (
                f"node {part.node} has {free_memory:.0f} MB of host memory free, "
                f"{job.memory_mb:.0f} MB asked"
            )
        for index in part.gpu_indices:
            gid = snapshot.gpu_ids.get((part.node, index))
            if gid is None:
                return f"node {part.node} has no GPU {index}"
            where = f"GPU {part.node}/{index}"
            if ledger.gpu_jobs[gid]:
                if p.mode == SharingMode.EXCLUSIVE or ledger.gpu_mode[gid] == "exclusive":
                    return f"{where} is held exclusively"
                if ledger.gpu_mode[gid] not in (None, p.mode.value):
                    return f"{where} is in {ledger.gpu_mode[gid]} mode, not {p.mode}"
                why = job.whole_gpu_reason()
                if why is not None:
                    return f"{where} runs other jobs and {why}"
            if p.mode != SharingMode.TIME_SLICING and need > ledger.gpu_free_mb[gid] + 1e-6:
                return f"{where} has {ledger.gpu_free_mb[gid]:.0f} MB free, {need:.0f} MB needed"
    return None


def _write_decision(
    decision: Decision, job: JobSpec, snapshot: Snapshot, ledger: _Ledger, actor: str
) -> bool:
    """Write one decision as the job's next attempt (all parts in one transaction)."""
    p = decision.placement
    job_id = int(job.id)
    parts = p.parts
    gpu_ids = [snapshot.gpu_ids[key] for key in p.gpu_keys]
    try:
        with transaction.atomic():
            job_transition(
                Job(pk=job_id),
                JobState.SCHEDULED,
                actor=actor,
                message=f"placed on {_where(p)} by {decision.policy}: {decision.explanation}",
                expected=JobState.PENDING,
                waiting_reason="",
            )
            attempt = Placement.objects.filter(job_id=job_id).count() + 1
            placement = Placement.objects.create(
                job_id=job_id,
                attempt=attempt,
                node_id=snapshot.node_ids[p.node],
                sharing_mode=p.mode.value,
                mps_percentage=p.mps_percentage,
                mig_profile=p.mig_profile or "",
                gpu_memory_mb=job.memory_need_mb() if gpu_ids else 0.0,
                cpus=p.cpus,
                policy=decision.policy,
                explanation=decision.explanation,
                score=decision.score,
            )
            PlacementPart.objects.bulk_create(
                PlacementPart(
                    placement=placement,
                    node_id=snapshot.node_ids[part.node],
                    node_rank=rank,
                    gpu_indices=list(part.gpu_indices),
                    cpus=part.cpus,
                )
                for rank, part in enumerate(parts)
            )
            if gpu_ids:
                placement.gpus.set(gpu_ids)
                Gpu.objects.filter(pk__in=gpu_ids).update(current_mode=p.mode.value)
    except IllegalTransition:
        return False  # cancelled (or placed) meanwhile: nothing written
    for part in parts:
        ledger.node_free_cores[snapshot.node_ids[part.node]] -= part.cpus
        node_id = snapshot.node_ids[part.node]
        free_memory = ledger.node_free_memory.get(node_id)
        if free_memory is not None:
            ledger.node_free_memory[node_id] = free_memory - job.memory_mb
    for gid in gpu_ids:
        ledger.gpu_jobs[gid] += 1
        ledger.gpu_mode[gid] = p.mode.value
        ledger.gpu_free_mb[gid] -= job.memory_need_mb()
    return True


def _where(p: DomainPlacement) -> str:
    """Where a placement runs, in words; a gang lists every node."""
    mode = p.mode.value.replace("_", "-")
    extra = ""
    if p.mps_percentage is not None:
        extra = f" {p.mps_percentage}%"
    if p.mig_profile:
        extra = f" {p.mig_profile}"
    texts = []
    for part in p.parts:
        if not part.gpu_indices:
            texts.append(f"{part.node} (CPU, {part.cpus} cores)")
        else:
            gpus = ",".join(str(i) for i in part.gpu_indices)
            texts.append(f"{part.node} GPU {gpus} ({mode}{extra})")
    return " + ".join(texts)


def _apply_action(action: Action, snapshot: Snapshot, actor: str) -> set[str]:
    """Apply one action on a running job; returns the nodes whose agents must hear of it."""
    job_id = int(action.job_id)
    nodes = snapshot.running_nodes.get(job_id) or job_nodes(job_id)
    message = f"{action.policy}: {action.explanation}"
    try:
        if action.kind == ActionKind.PAUSE:
            job_transition(
                Job(pk=job_id),
                JobState.PAUSED,
                actor=actor,
                message=message,
                expected=JobState.RUNNING,
            )
            return set(nodes)
        if action.kind == ActionKind.RESUME:
            job_transition(
                Job(pk=job_id),
                JobState.RUNNING,
                actor=actor,
                message=message,
                expected=JobState.PAUSED,
            )
            return set(nodes)
        if action.kind == ActionKind.REQUEUE:
            # Preemption (docs/preemption.md): the attempt ends "preempted" with the policy's
            # explanation; the agents stop it with a grace; the job is placed again later.
            job_preempt(Job(pk=job_id), actor=actor, reason=message)
            return set(nodes)
    except IllegalTransition as exc:
        log.info("action %s on job %s skipped: %s", action.kind, job_id, exc)
        return set()
    if action.kind in (ActionKind.SET_WORKERS, ActionKind.REPLACE_WORKERS):
        from portal.core.elastic import elastic_change_propose

        if elastic_change_propose(job_id, action, actor=actor):
            return set(nodes)
        return set()
    if action.kind == ActionKind.SET_DATA_RATIO:
        placement = Placement.objects.filter(job_id=job_id, active=True).first()
        if placement is not None and training.data_ratio_set(
            placement, list(action.value or ()), actor=actor, explanation=message
        ):
            return set()
    # Actions the live path does not act on: keep the reason.
    JobEvent.objects.create(
        job_id=job_id,
        from_state="",
        to_state="",
        actor=actor,
        message=f"{message} (not applied live: {action.kind.value})",
    )
    return set()


def _store_waiting(snapshot: Snapshot, waiting: dict[str, str], placed: set[int]) -> None:
    """Keep each queued job's latest waiting reason (written only where it changed)."""
    wanted = {int(k): v[:2000] for k, v in waiting.items()}
    ids = [i for i in snapshot.pending_ids if i not in placed]
    if not ids:
        return
    current = dict(Job.objects.filter(pk__in=ids).values_list("pk", "waiting_reason"))
    by_reason: dict[str, list[int]] = defaultdict(list)
    for job_id in ids:
        reason = wanted.get(job_id, "")
        if current.get(job_id) is not None and current[job_id] != reason:
            by_reason[reason].append(job_id)
    for reason, job_ids in by_reason.items():
        Job.objects.filter(pk__in=job_ids, state=JobState.PENDING).update(waiting_reason=reason)


def _settle_gated(snapshot: Snapshot, actor: str) -> None:
    """Store the reasons of the jobs the gate kept from the policy, and cancel those whose
    dependency can never be met (``portal.core.jobcontrol``)."""
    for job_id, reason in snapshot.doomed.items():
        try:
            job_cancel(Job(pk=job_id), actor=actor, message=reason)
        except IllegalTransition:
            continue  # cancelled or changed meanwhile
        Job.objects.filter(pk=job_id).update(failure_reason=reason[:2000])
    by_reason: dict[str, list[int]] = defaultdict(list)
    for job_id, reason in snapshot.gated.items():
        by_reason[reason[:2000]].append(job_id)
    for reason, job_ids in by_reason.items():
        Job.objects.filter(pk__in=job_ids, state=JobState.PENDING).exclude(
            waiting_reason=reason
        ).update(waiting_reason=reason)


def active_policy_settings() -> PolicySettings:
    """The active ``PolicySettings`` row, locked for this transaction (created as fifo if none)."""
    row = PolicySettings.objects.select_for_update().filter(active=True).first()
    if row is None:
        PolicySettings.objects.get_or_create(
            name="default", defaults={"policy": "fifo", "params": {}, "active": True}
        )
        row = PolicySettings.objects.select_for_update().filter(active=True).first()
    assert row is not None
    return row


# ---------------------------------------------------------------------------------------------
# Running the policy: a configuration that fails at run time does not stop scheduling


#: What the loop runs when the active configuration fails and no configuration ever worked.
SAFE_POLICY: tuple[str, dict[str, Any]] = ("fifo", {})


def _run_policy(name: str, params: dict[str, Any], state: ClusterState, seed: int | None) -> Any:
    params = dict(params)
    cycle_seed = params.pop("seed", None) if seed is None else seed
    policy = build_policy(name, params)
    rng = random.Random(cycle_seed if cycle_seed is not None else int(state.now_s))
    return policy, policy.schedule(state, rng)


def _fallbacks(row: PolicySettings) -> list[tuple[str, dict[str, Any]]]:
    """Configurations to run instead of ``row``'s: the last one that worked under this row,
    then the last good one of the other rows (most recently changed first), then fifo."""
    current = (row.policy, dict(row.params or {}))
    out: list[tuple[str, dict[str, Any]]] = []
    rows = [row, *PolicySettings.objects.exclude(pk=row.pk).order_by("-updated_at")]
    for r in rows:
        if r.last_good_policy:
            candidate = (r.last_good_policy, dict(r.last_good_params or {}))
            if candidate != current and candidate not in out:
                out.append(candidate)
    if SAFE_POLICY not in out and current != SAFE_POLICY:
        out.append(SAFE_POLICY)
    return out


def _describe(name: str, params: dict[str, Any]) -> str:
    return f"{name} {json.dumps(params, sort_keys=True)}" if params else name


def _plan_with_fallback(row: PolicySettings, state: ClusterState, seed: int | None) -> Any:
    """Run the active configuration; if building or running it raises, run the last good
    configuration instead (``_fallbacks``). The error is stored on the row (the cluster page
    and the admin show it) and logged once, when it first appears or changes; it is cleared,
    with a log line, once the configuration works again. Returns (policy, plan)."""
    params = dict(row.params or {})
    try:
        policy, plan = _run_policy(row.policy, params, state, seed)
    except Exception as exc:
        # A configuration the form would refuse (saved before validation, or written to the
        # database directly): name the bad field rather than quote the policy's own error.
        fields = validate_policy_settings(row.policy, params, trial=False)
        error = "; ".join(f"{k}: {v}" for k, v in fields.items()) or f"{type(exc).__name__}: {exc}"
        error = error[:4000]
        for name, fallback_params in _fallbacks(row):
            try:
                policy, plan = _run_policy(name, fallback_params, state, seed)
            except Exception:
                log.debug("fallback policy %s failed too", name, exc_info=True)
                continue
            _record_failure(row, error, _describe(name, fallback_params), exc)
            return policy, plan
        _record_failure(row, error, "", exc)
        raise
    _record_success(row, params)
    return policy, plan


def _record_failure(row: PolicySettings, error: str, fallback: str, exc: BaseException) -> None:
    if row.runtime_error == error and row.runtime_fallback == fallback:
        log.debug("policy settings %r still fail: %s", row.name, error)
        return
    log.error(
        "policy settings %r (%s) failed at run time: %s; %s (logged once until it changes)",
        row.name,
        _describe(row.policy, dict(row.params or {})),
        error,
        f"running {fallback} instead" if fallback else "no fallback works either",
        exc_info=(type(exc), exc, exc.__traceback__),
    )
    now = timezone.now()
    PolicySettings.objects.filter(pk=row.pk).update(
        runtime_error=error, runtime_error_at=now, runtime_fallback=fallback
    )
    row.runtime_error, row.runtime_error_at, row.runtime_fallback = error, now, fallback


def _record_success(row: PolicySettings, params: dict[str, Any]) -> None:
    changes: dict[str, Any] = {}
    if row.runtime_error:
        log.warning(
            "policy settings %r (%s) work again (they failed with: %s)",
            row.name,
            _describe(row.policy, params),
            row.runtime_error,
        )
        changes.update(runtime_error="", runtime_error_at=None, runtime_fallback="")
    if row.last_good_policy != row.policy or row.last_good_params != params:
        changes.update(last_good_policy=row.policy, last_good_params=params)
    if changes:  # update(): no auto_now bump, so updated_at keeps meaning "edited by a person"
        PolicySettings.objects.filter(pk=row.pk).update(**changes)
        for key, value in changes.items():
            setattr(row, key, value)


def run_cycle(*, actor: str = "scheduler", seed: int | None = None) -> CycleResult:
    """One scheduling cycle (see the module docstring). Safe to call from many workers."""
    started = time.perf_counter()
    result = CycleResult()
    to_nudge: set[str] = set()
    with _CYCLE_LOCK, transaction.atomic():
        settings_row = active_policy_settings()
        result.policy = settings_row.policy
        snapshot = build_snapshot()
        state = snapshot.state
        result.pending = len(state.pending)
        _settle_gated(snapshot, actor)
        if not state.pending and not state.running:
            result.seconds = time.perf_counter() - started
            return result
        t0 = time.perf_counter()
        policy, plan = _plan_with_fallback(settings_row, state, seed)
        result.policy_seconds = time.perf_counter() - t0
        result.fallback = settings_row.runtime_fallback

        jobs = {j.id: j for j in state.pending}
        ledger = _ledger(snapshot)
        placed: set[int] = set()
        for decision in plan.decisions:
            job = jobs.get(decision.placement.job_id)
            if job is None or int(job.id) in placed:
                continue
            reason = _refusal(decision, job, snapshot, ledger)
            if reason is not None:
                result.refused[int(job.id)] = reason
                log.error("policy %s: refused decision for job %s: %s", policy.name, job.id, reason)
                continue
            if _write_decision(decision, job, snapshot, ledger, actor):
                placed.add(int(job.id))
                result.placed.append(int(job.id))
                to_nudge.update(decision.placement.nodes)
        for action in plan.actions:
            if int(action.job_id) in snapshot.user_paused:
                # Its owner paused it: it stays paused until they resume it (no policy
                # resumes, pauses again or requeues it meanwhile).
                continue
            to_nudge |= _apply_action(action, snapshot, actor)
            result.actions.append((action.kind.value, int(action.job_id)))
        waiting = dict(plan.waiting)
        for job_id, reason in result.refused.items():
            waiting[str(job_id)] = f"decision refused: {reason}"
        _store_waiting(snapshot, waiting, placed)
        result.waiting = len(state.pending) - len(placed)
        if to_nudge:
            emit_nudges(to_nudge, "scheduling cycle")
    result.seconds = time.perf_counter() - started
    # Prometheus' decision latency histogram (portal.core.prometheus; best effort, after commit)
    observe_decision_latency(result.policy_seconds, result.seconds)
    if result.placed or result.actions or result.refused:
        log.info("cycle %s", result.summary())
    return result
