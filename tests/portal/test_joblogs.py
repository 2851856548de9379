"""The full log store (portal.core.joblogs) and the agent's chunking (workers.agent)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.core.joblogs import job_log_chunks, job_logs_prune, log_chunks_store
from portal.core.models import Job, JobLogChunk
from workers.agent import LOG_CHUNK_BYTES, read_log_chunks
from workers.protocol import LogChunk

pytestmark = pytest.mark.django_db


def _chunk(job: Job, offset: int, text: str, attempt: int = 1) -> LogChunk:
    return LogChunk(job.pk, attempt, offset, text, len(text.encode()))


def test_chunks_are_kept_once_in_order_and_only_from_the_attempts_node(alice):
    job = Job.objects.create(owner=alice, name="j", command="true")
    other = Job.objects.create(owner=alice, name="k", command="true")
    mine = {(job.pk, 1), (job.pk, 2)}
    assert log_chunks_store([_chunk(job, 0, "a\n"), _chunk(job, 2, "bé\n")], mine) == 2
    # a retry, and an agent that restarted and read again from the attempt's start
    assert log_chunks_store([_chunk(job, 2, "bé\n"), _chunk(job, 0, "a\nbé\nc\n")], mine) == 0
    assert log_chunks_store([_chunk(job, 6, "c\n"), _chunk(job, 0, "2nd\n", 2)], mine) == 2
    assert log_chunks_store([_chunk(other, 0, "not from this node\n")], mine) == 0
    assert "".join(job_log_chunks(job)) == "a\nbé\nc\n2nd\n"
    assert "".join(job_log_chunks(job, 2)) == "2nd\n"
    assert not JobLogChunk.objects.filter(job=other).exists()


def test_logs_of_jobs_that_ended_before_the_retention_are_pruned(alice, settings):
    settings.COSCHED = {**settings.COSCHED, "LOG_RETENTION_DAYS": 30}
    now = timezone.now()
    old = Job.objects.create(owner=alice, name="old", command="true", state="COMPLETED")
    Job.objects.filter(pk=old.pk).update(finished_at=now - timedelta(days=31))
    recent = Job.objects.create(owner=alice, name="new", command="true", state="COMPLETED")
    Job.objects.filter(pk=recent.pk).update(finished_at=now - timedelta(days=29))
    running = Job.objects.create(owner=alice, name="run", command="true", state="RUNNING")
    for job in (old, recent, running):
        JobLogChunk.objects.create(job=job, attempt=1, seq=0, size=2, text="x\n")
    assert job_logs_prune(now) == 1
    assert set(JobLogChunk.objects.values_list("job__name", flat=True)) == {"new", "run"}


def test_the_agent_cuts_chunks_at_line_ends_and_never_inside_a_character(tmp_path):
    path = tmp_path / "job.log"
    line = ("é" * 100 + "\n").encode()  # 201 bytes
    body = line * (2 * LOG_CHUNK_BYTES // len(line) + 3) + "ünfinished".encode()
    path.write_bytes(body)
    chunks = read_log_chunks(7, 1, path, 0, 10)
    assert len(chunks) >= 3
    assert all(c.text.endswith("\n") for c in chunks[:-1])
    assert "".join(c.text for c in chunks) == body.decode()
    assert sum(c.size for c in chunks) == len(body)
    assert [c.offset for c in chunks] == [
        sum(c.size for c in chunks[:i]) for i in range(len(chunks))
    ]
    # one long line without a line end: cut at a character boundary, never inside one
    for prefix in (b"", b"x", b"xy"):
        path.write_bytes(prefix + "€".encode() * LOG_CHUNK_BYTES)  # 3 bytes each
        chunks = read_log_chunks(7, 1, path, 0, 5)
        assert "".join(c.text for c in chunks) == prefix.decode() + "€" * LOG_CHUNK_BYTES
        assert all("\ufffd" not in c.text for c in chunks)
