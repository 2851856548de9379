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
