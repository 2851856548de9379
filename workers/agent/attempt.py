"""What the node agent keeps of one attempt it started or adopted (``LocalAttempt``)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.domain import Profile
from workers.protocol import AttemptKey, AttemptResult, AttemptSpec


@dataclass
class LocalAttempt:
    """One attempt this agent started (or adopted): its directory, processes and what it
    reports."""

    spec: AttemptSpec
    dir: Path
    log_path: Path
    started_at: float  # epoch s, when the runner was started
    log_offset: int = 0  # bytes of the log already read for reports
    runner: subprocess.Popen[bytes] | None = None  # when this process started the runner
    runner_pid: int | None = None
    runner_ticks: int | None = None
    job_pid: int | None = None
    job_ticks: int | None = None
    job_pgids: tuple[int, ...] = ()  # every process group of the job (one per rank)
    paused: bool = False  # what was applied (SIGSTOP) to the job's group
    stopping: bool = False
    result: AttemptResult | None = None  # set once the runner recorded how it ended
    attached: bool = False  # to the virtual backend
    profile: Profile | None = None
    mig_uuid: str | None = None
    tail_size: int = -1  # log size when its tail was last sent
    log_sent: int = -1  # bytes of the log the portal has in full (-1: from log_offset on)
    sending_tail_size: int = -1  # log size when the tail in the request in flight was read
    progress: float | None = None
    iters_done: int | None = None
    iters_total: int | None = None
    iter_time_s: float | None = None
    active_s: float | None = None
    run_s: float | None = None  # the emulator's own solo run time (scaled), when it says
    resumed_from: float = 0.0  # fraction of the work done by earlier attempts (a checkpoint)
    pidfd: int | None = field(default=None, repr=False)

    @property
    def key(self) -> AttemptKey:
        return self.spec.key

    @property
    def job_id(self) -> int:
        return self.spec.job_id

    def solo_time_s(self) -> float | None:
        """Solo run time (s) for ALGORITHMS.md §5: what the job says it needs alone (the
        emulator's ``run_s``), else the profile's time on this GPU model (or CPU time); for an
        attempt that resumed from a checkpoint, the share of it still to do."""
        if self.run_s:
            solo: float | None = float(self.run_s)
        elif self.profile is None:
            return None
        elif self.spec.part.gpu_indices:
            solo = self.profile.gpu_time_s.get(self.spec.gpu_model or "")
        else:
            solo = self.profile.cpu_time_s
        if solo is not None and 0.0 < self.resumed_from < 1.0:
            # A resumed attempt has only the rest of the work to do: its Slow-Down is measured
            # against that share (else it would read below 1).
            solo *= 1.0 - self.resumed_from
        return solo
