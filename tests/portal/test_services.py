"""Services called directly (forms, tasks and the CLI path use them too)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from portal.core import services
from portal.core.importers import ProfileRecord
from portal.core.models import ApplicationProfile, Job, JobEvent

pytestmark = pytest.mark.django_db


def test_job_submit_creates_a_pending_job_with_an_event(alice):
    job, created = services.job_submit(alice, name="a", command="true")
    assert created and job.state == "PENDING"
    event = JobEvent.objects.get(job=job)
    assert (event.from_state, event.to_state, event.actor) == ("", "PENDING", "user:alice")


def test_job_submit_reports_every_rule_per_field(alice):
    draft = ApplicationProfile.objects.create(name="d")
    with pytest.raises(ValidationError) as info:
        services.job_submit(
            alice,
            name="a",
            command=" ",
            profile=draft,
            gpus=0,
            gpu_memory_mb=100,
            elastic_min_workers=3,
            elastic_max_workers=2,
        )
    assert set(info.value.message_dict) == {
        "profile",
        "command",
        "gpu_memory_mb",
        "elastic_max_workers",
    }
    assert Job.objects.count() == 0


def test_rule_errors_skip_fields_that_already_failed():
    assert services.job_rule_errors({}, skip={"command"}) == {}
    assert "command" in services.job_rule_errors({})
    assert services.job_rule_errors({"gpu_memory_mb": 5}, skip={"gpus"}) == {
        "command": ["give a command (or a container image)"]
    }


def test_idempotent_submit_at_the_service_level(alice, bob):
    first, created = services.job_submit(alice, idempotency_key="k", name="a", command="x")
    again, created_again = services.job_submit(alice, idempotency_key="k", name="a", command="x")
    assert created and not created_again and again.pk == first.pk
    with pytest.raises(services.IdempotencyConflict) as info:
        services.job_submit(alice, idempotency_key="k", name="b", command="x")
    assert info.value.job.pk == first.pk
    other, created_other = services.job_submit(bob, idempotency_key="k", name="a", command="x")
    assert created_other and other.pk != first.pk


def test_cancel_writes_the_actor(alice):
    job, _ = services.job_submit(alice, name="a", command="x")
    services.job_cancel(job, actor="user:alice", message="no longer needed")
    event = job.events.last()
    assert (event.to_state, event.actor, event.message) == (
        "CANCELLED",
        "user:alice",
        "no longer needed",
    )


def test_profile_save_creates_and_updates(staff):
    record = ProfileRecord(
        row=None,
        fields={"name": "p", "version": "1", "cpu_time_s": 10.0},
        gpu_times={"V100": 2.0},
        memory_steps=[(0.0, 0.0, 100.0)],
    )
    profile = services.profile_save(record, actor=staff)
    assert (profile.status, profile.source, profile.created_by) == ("draft", "manual", staff)
    assert profile.gpu_times.get().time_s == 2.0
    update = ProfileRecord(row=None, fields={"name": "p", "version": "1", "ipc": 1.2})
    services.profile_save(update, actor=staff, profile=profile)
    profile.refresh_from_db()
    assert (profile.cpu_time_s, profile.ipc, profile.gpu_times.count()) == (10.0, 1.2, 1)
    with pytest.raises(ValidationError):
        services.profile_save(record, actor=staff)


def test_profile_approve_and_retire(staff):
    profile = ApplicationProfile.objects.create(name="p")
    services.profile_approve(profile, actor=staff)
    assert (profile.status, profile.approved_by) == ("approved", staff)
    services.profile_retire(profile, actor=staff)
    assert profile.status == "retired"
    assert profile.approved_by == staff  # history kept


def test_profile_import_rejects_unknown_status(staff):
    from portal.core.importers import ProfileImportError

    with pytest.raises(ProfileImportError):
        services.profile_import("name\na\n", actor=staff, status="published")
