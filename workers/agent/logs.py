"""An attempt's log on the node: its header line and the pieces of it the agent sends (the live
tail, the full log in chunks: docs/job-control.md)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from workers.protocol import AttemptSpec, LogChunk

LOG_TAIL_BYTES = 16 * 1024  # what the agent sends for the job page's live log
# The full log goes to the portal in chunks of at most this many bytes (docs/job-control.md):
# one per running attempt and periodic sync, up to LOG_CHUNKS_PER_SYNC of an ended one.
LOG_CHUNK_BYTES = 256 * 1024
LOG_CHUNKS_PER_SYNC = 4


def _utf8_boundary(data: bytes) -> int:
    """The length of ``data`` without a UTF-8 character cut at its end."""
    start = len(data) - 1
    while start > 0 and len(data) - start < 4 and (data[start] & 0xC0) == 0x80:
        start -= 1
    lead = data[start]
    need = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return len(data) if start + need <= len(data) else (start or len(data))


def read_log_chunks(
    job_id: int, attempt: int, path: Path, start: int, count: int
) -> list[LogChunk]:
    """Up to ``count`` chunks of ``path`` from byte ``start`` on, each ending at a line end
    when it has one (else at a character boundary), so no chunk splits a UTF-8 character."""
    out: list[LogChunk] = []
    try:
        with open(path, "rb") as f:
            f.seek(start)
            for _ in range(count):
                data = f.read(LOG_CHUNK_BYTES)
                if not data:
                    break
                cut = len(data)
                if len(data) == LOG_CHUNK_BYTES:
                    newline = data.rfind(b"\n")
                    cut = newline + 1 if newline >= 0 else _utf8_boundary(data)
                text = data[:cut].decode("utf-8", "replace")
                out.append(LogChunk(job_id, attempt, start, text, cut))
                start += cut
                f.seek(start)
    except OSError:
        return out
    return out


def describe(spec: AttemptSpec, node: str) -> str:
    """Where this node's part runs, in words ("gpu-1 GPU 0,1 (mps 40%)")."""
    part = spec.part
    if not part.gpu_indices:
        return f"{node} (CPU, {part.cpus} cores)"
    mode = spec.mode.replace("_", "-")
    extra = f" {spec.mps_percentage}%" if spec.mps_percentage is not None else ""
    extra = f" {spec.mig_profile}" if spec.mig_profile else extra
    gpus = ",".join(map(str, part.gpu_indices))
    return f"{node} GPU {gpus} ({mode}{extra})"


def write_header(path: Path, spec: AttemptSpec, node: str) -> int:
    """Append one line marking a new attempt; returns the log's size after it (bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    rank = f", node rank {spec.node_rank} of {len(spec.parts)}" if spec.is_gang else ""
    # Private from the start (0600); the runner gives it to the job's account.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    with open(fd, "a", encoding="utf-8") as f:
        f.write(
            f"[cosched] job {spec.job_id} attempt {spec.attempt} on {describe(spec, node)}"
            f"{rank}, {stamp}\n"
        )
        return f.tell()


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1
