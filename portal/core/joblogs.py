"""A job's full output, kept in PostgreSQL (docs/job-control.md).

The node agent streams each attempt's log in chunks (``workers.protocol.LogChunk``: a byte
offset in the node's log file, the text, its size in bytes); a sync stores them in its own
transaction, so a chunk is kept once whatever the retries: a chunk that begins before the
end of what is stored for its attempt is skipped. The text is read back whole, attempt by
attempt, by the download link and ``cosched logs --all``; chunks of jobs that ended more than
``COSCHED_LOG_RETENTION_DAYS`` ago are deleted by ``job_logs_prune``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F, Max
from django.utils import timezone

from portal.core.models import Job, JobLogChunk


def log_chunks_store(chunks: Iterable[Any], allowed: set[tuple[int, int]]) -> int:
    """Store the chunks of attempts in ``allowed`` ((job id, attempt) of the sending node);
    returns how many were new."""
    by_attempt: dict[tuple[int, int], list[Any]] = {}
    for chunk in chunks:
        key = (chunk.job_id, chunk.attempt)
        if key in allowed and chunk.text:
            by_attempt.setdefault(key, []).append(chunk)
    if not by_attempt:
        return 0
    ends = {
        (job_id, attempt): end
        for job_id, attempt, end in JobLogChunk.objects.filter(
            job_id__in={k[0] for k in by_attempt}
        )
        .values("job_id", "attempt")
        .annotate(end=Max(F("seq") + F("size")))
        .values_list("job_id", "attempt", "end")
    }
    rows = []
    for key, items in by_attempt.items():
        end = ends.get(key, 0)
        for chunk in sorted(items, key=lambda c: c.offset):
            if chunk.offset < end:
                continue  # sent before (a retry, or an agent that restarted)
            rows.append(
                JobLogChunk(
                    job_id=key[0],
                    attempt=key[1],
                    seq=chunk.offset,
                    size=chunk.size,
                    text=chunk.text.replace("\x00", "\ufffd"),
                )
            )
            end = chunk.offset + chunk.size
    JobLogChunk.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def job_log_chunks(job: Job, attempt: int | None = None) -> Iterator[str]:
    """The job's full log, attempt after attempt (each begins with the agent's header line),
    as pieces of text in order; ``attempt``: only that one."""
    rows = JobLogChunk.objects.filter(job=job)
    if attempt is not None:
        rows = rows.filter(attempt=attempt)
    yield from (
        rows.order_by("attempt", "seq").values_list("text", flat=True).iterator(chunk_size=64)
    )


def job_log_size(job: Job) -> int:
    """Bytes of the job's log the portal keeps (every attempt)."""
    from django.db.models import Sum

    return int(JobLogChunk.objects.filter(job=job).aggregate(n=Sum("size"))["n"] or 0)


def retention() -> timedelta:
    return timedelta(days=float(settings.COSCHED.get("LOG_RETENTION_DAYS", 30)))


def job_logs_prune(now: datetime | None = None) -> int:
    """Delete the logs of jobs that ended more than the retention ago; returns rows deleted."""
    cutoff = (now or timezone.now()) - retention()
    deleted, _ = JobLogChunk.objects.filter(
        job__finished_at__isnull=False, job__finished_at__lt=cutoff
    ).delete()
    return deleted
