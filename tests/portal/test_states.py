"""The job state machine: every legal transition works and writes a JobEvent, every illegal
one raises IllegalTransition with a clear message, and two racing transitions have one winner."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from portal.core import services
from portal.core.models import Job, JobEvent, Node, Placement
from portal.core.states import (
    PLACED,
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    JobState,
    can_transition,
    sources_of,
)

LEGAL = [(src, dst) for src, targets in TRANSITIONS.items() for dst in targets]
ILLEGAL = [(src, dst) for src in JobState for dst in JobState if dst not in TRANSITIONS[src]]

# A path from PENDING to every state, through legal transitions only.
PATH = {
    JobState.PENDING: [],
    JobState.SCHEDULED: [JobState.SCHEDULED],
    JobState.RUNNING: [JobState.SCHEDULED, JobState.RUNNING],
    JobState.PAUSED: [JobState.SCHEDULED, JobState.RUNNING, JobState.PAUSED],
    JobState.COMPLETED: [JobState.SCHEDULED, JobState.RUNNING, JobState.COMPLETED],
    JobState.FAILED: [JobState.FAILED],
    JobState.CANCELLED: [JobState.CANCELLED],
}


def _job_in(owner, state: JobState) -> Job:
    job, _ = services.job_submit(owner, name="j", command="true")
    for step in PATH[state]:
        services.job_transition(job, step, actor="test")
    job.refresh_from_db()
    assert job.state == state
    return job


def test_the_machine_matches_the_issue():
    assert set(TRANSITIONS[JobState.PENDING]) == {"SCHEDULED", "CANCELLED", "FAILED"}
    assert JobState.PENDING in TRANSITIONS[JobState.SCHEDULED]  # requeue
    assert JobState.PENDING in TRANSITIONS[JobState.RUNNING]
    assert JobState.PAUSED in TRANSITIONS[JobState.RUNNING]
    assert JobState.RUNNING in TRANSITIONS[JobState.PAUSED]
    assert all(not TRANSITIONS[s] for s in TERMINAL)
    assert set(PLACED) == {"SCHEDULED", "RUNNING", "PAUSED"}
    assert sorted(sources_of("RUNNING")) == ["PAUSED", "SCHEDULED"]
    assert len(LEGAL) + len(ILLEGAL) == len(JobState) ** 2


@pytest.mark.django_db
@pytest.mark.parametrize(("src", "dst"), LEGAL, ids=[f"{s}->{d}" for s, d in LEGAL])
def test_every_legal_transition_works_and_writes_an_event(alice, src, dst):
    job = _job_in(alice, src)
    before = JobEvent.objects.filter(job=job).count()
    services.job_transition(job, dst, actor="scheduler", message="because")
    job.refresh_from_db()
    assert job.state == dst
    assert JobEvent.objects.filter(job=job).count() == before + 1
    event = JobEvent.objects.filter(job=job).last()
    assert (event.from_state, event.to_state, event.actor, event.message) == (
        src,
        dst,
        "scheduler",
        "because",
    )
    if dst in TERMINAL:
        assert job.finished_at is not None
    if dst == JobState.PENDING:
        assert job.requeue_count == 1
        assert job.scheduled_at is None and job.started_at is None
    if dst == JobState.RUNNING and src == JobState.SCHEDULED:
        assert job.started_at is not None


@pytest.mark.django_db
@pytest.mark.parametrize(("src", "dst"), ILLEGAL, ids=[f"{s}->{d}" for s, d in ILLEGAL])
def test_every_illegal_transition_raises_and_changes_nothing(alice, src, dst):
    job = _job_in(alice, src)
    events = JobEvent.objects.filter(job=job).count()
    with pytest.raises(IllegalTransition) as info:
        services.job_transition(job, dst, actor="test")
    message = str(info.value)
    assert f"job {job.pk}" in message
    assert f"cannot go from {src} to {dst}" in message
    assert "allowed from" in message
    job.refresh_from_db()
    assert job.state == src
    assert JobEvent.objects.filter(job=job).count() == events
    assert not can_transition(src, dst)


def test_illegal_transition_message_for_a_final_state():
    err = IllegalTransition(7, "COMPLETED", "RUNNING")
    assert str(err) == (
        "job 7: cannot go from COMPLETED to RUNNING; allowed from COMPLETED: none (final state)"
    )


@pytest.mark.django_db
def test_a_stale_expected_state_loses(alice):
    job = _job_in(alice, JobState.SCHEDULED)
    with pytest.raises(IllegalTransition):
        services.job_transition(job, JobState.SCHEDULED, actor="x", expected="PENDING")


@pytest.mark.django_db
def test_fields_are_written_with_the_transition(alice):
    job = _job_in(alice, JobState.RUNNING)
    services.job_transition(job, "FAILED", actor="node:gpu-1", exit_code=137, failure_reason="OOM")
    job.refresh_from_db()
    assert (job.exit_code, job.failure_reason) == (137, "OOM")


@pytest.mark.django_db
def test_a_resume_keeps_the_first_start_time(alice):
    job = _job_in(alice, JobState.RUNNING)
    first_start = job.started_at
    assert first_start is not None
    services.job_transition(job, JobState.PAUSED, actor="scheduler")
    services.job_transition(job, JobState.RUNNING, actor="scheduler")
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.started_at == first_start


@pytest.mark.django_db
def test_requeue_counts_up_and_releases_the_placement(alice):
    job = _job_in(alice, JobState.RUNNING)  # before the node: a CPU job a GPU node never admits
    node = Node.objects.create(name="n1", kind="gpu")
    Placement.objects.create(job=job, node=node, policy="fifo")
    services.job_transition(job, "PENDING", actor="scheduler", message="node lost")
    services.job_transition(job, "SCHEDULED", actor="scheduler")
    services.job_transition(job, "PENDING", actor="scheduler")
    job.refresh_from_db()
    assert job.requeue_count == 2
    assert not job.placements.filter(active=True).exists()
    assert job.placements.get().released_at is not None


@pytest.mark.django_db
def test_a_terminal_transition_releases_the_placement(alice):
    job = _job_in(alice, JobState.RUNNING)  # before the node: a CPU job a GPU node never admits
    node = Node.objects.create(name="n1", kind="gpu")
    Placement.objects.create(job=job, node=node, policy="fifo")
    services.job_cancel(job, actor="user:alice")
    assert job.current_placement is None


@pytest.mark.django_db
def test_a_note_keeps_the_state(alice):
    job = _job_in(alice, JobState.RUNNING)
    event = services.job_note(job, actor="scheduler", message="paused soon")
    assert (event.from_state, event.to_state) == ("RUNNING", "RUNNING")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        # Two workers that both read PENDING: the conditional UPDATE lets one through.
        ("SCHEDULED", "CANCELLED", "PENDING"),
        ("SCHEDULED", "SCHEDULED", "PENDING"),
        ("SCHEDULED", "SCHEDULED", None),
        # Two final states: whichever lands first makes the other illegal.
        ("CANCELLED", "FAILED", None),
    ],
)
def test_two_threads_race_and_one_wins(alice, first, second, expected):
    job, _ = services.job_submit(alice, name="race", command="true")
    barrier = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def attempt(label: str, target: str) -> None:
        try:
            barrier.wait(timeout=10)
            services.job_transition(
                Job.objects.get(pk=job.pk), target, actor=label, expected=expected
            )
            outcomes[label] = "won"
        except IllegalTransition:
            outcomes[label] = "lost"
        except Exception as exc:  # reported by the assertion below
            outcomes[label] = f"error {exc!r}"
        finally:
            connection.close()

    threads = [
        threading.Thread(target=attempt, args=("a", first)),
        threading.Thread(target=attempt, args=("b", second)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(outcomes.values()) == ["lost", "won"], outcomes
    winner = next(label for label, result in outcomes.items() if result == "won")
    job.refresh_from_db()
    assert job.state == (first if winner == "a" else second)
    transitions = JobEvent.objects.filter(job=job).exclude(from_state="")
    assert transitions.count() == 1
    assert transitions.get().actor == winner
