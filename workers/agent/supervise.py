"""Watching the attempts an agent runs (``Supervising``, a part of ``NodeAgent``): pause and
resume, stop, the result each runner records, the log the portal does not have yet."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import time

from workers import runner as runner_files
from workers.agent.attempt import LocalAttempt
from workers.agent.logs import LOG_CHUNKS_PER_SYNC, LOG_TAIL_BYTES, file_size, read_log_chunks
from workers.launcher import tail
from workers.protocol import DEFAULT_STOP_GRACE_S, OUTCOMES, AttemptResult, LogChunk, Sample

log = logging.getLogger(__name__)

KILL_GRACE_S = DEFAULT_STOP_GRACE_S  # SIGTERM, then SIGKILL (until the portal says otherwise)


class Supervising:
    """The part of ``NodeAgent`` that controls the attempts it runs (pause, resume, stop) and
    collects how they ended, with the rest of their logs. A mixin on the agent's state
    (``_attempts``, ``_log_backlog``, ``_samples``), set up in ``NodeAgent.__init__``."""

    # --- control ----------------------------------------------------------------------------------

    def _set_paused(self, a: LocalAttempt, paused: bool) -> None:
        """SIGSTOP / SIGCONT the job's process group (once its runner has started it)."""
        if a.job_pid is None:
            self._read_job(a)
        if a.job_pid is None:
            return  # still starting: the next round applies it
        if paused:
            self._podman(a, "pause")  # the container's processes (the client's stop below)
        alive = False
        for pgid in a.job_pgids or (a.job_pid,):
            try:
                os.killpg(pgid, signal.SIGSTOP if paused else signal.SIGCONT)
                alive = True
            except ProcessLookupError:
                continue  # this rank has ended
        if not paused:
            self._podman(a, "unpause")
        if not alive:
            return  # it has ended; collect will see the result
        a.paused = paused
        if a.attached:
            self._virtual().set_paused(str(a.job_id), paused)
        log.info("%s: %s attempt %s", self.name, "paused" if paused else "resumed", a.key)

    def _stop(
        self, a: LocalAttempt, outcome: str, detail: str, grace_s: float = KILL_GRACE_S
    ) -> None:
        """Ask the attempt's runner to stop the job (SIGTERM, SIGKILL after ``grace_s``);
        the runner records the result."""
        runner_files.write_json(
            a.dir / runner_files.STOP, {"outcome": outcome, "detail": detail, "grace_s": grace_s}
        )
        a.stopping = True
        if a.runner_pid and runner_files.is_alive(a.runner_pid, a.runner_ticks):
            with contextlib.suppress(ProcessLookupError):
                os.kill(a.runner_pid, signal.SIGTERM)
        log.info("%s: stopping attempt %s: %s", self.name, a.key, detail)

    # --- collect ----------------------------------------------------------------------------------

    def _read_job(self, a: LocalAttempt) -> None:
        job = runner_files.read_json(a.dir / runner_files.JOB)
        if job is not None and job.get("pid"):
            a.job_pid, a.job_ticks = int(job["pid"]), job.get("start_ticks")
            a.job_pgids = tuple(int(g) for g in job.get("pgids") or ())
            if a.attached and self._virtual() is not None:
                self._virtual().set_pid(str(a.job_id), a.job_pid)

    def _collect(self) -> None:
        for a in list(self._attempts.values()):
            if a.result is None:
                self._collect_one(a)
            if a.result is None:
                self._follow(a)

    def _collect_one(self, a: LocalAttempt) -> bool:
        """Turn a finished runner's ``result.json`` into a result (True when it has one). A
        runner that died without one: its job's processes are killed, the result says lost."""
        if a.runner is not None:
            a.runner.poll()  # reap our own child, so it does not linger as a zombie
        if a.job_pid is None:
            self._read_job(a)
        data = runner_files.read_json(a.dir / runner_files.RESULT)
        if data is None:
            if runner_files.is_alive(a.runner_pid, a.runner_ticks):
                return False
            data = runner_files.read_json(a.dir / runner_files.RESULT)  # it may just have ended
        if data is None:
            killed = ""
            if a.job_pid and runner_files.is_alive(a.job_pid, a.job_ticks):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(a.job_pid, signal.SIGKILL)
                killed = f"; its job's process group {a.job_pid} was killed"
            if self._podman(a, "rm"):  # a container outlives its client: removed here
                killed += "; its container, if left, was removed"
            data = {
                "outcome": "lost",
                "exit_code": None,
                "detail": f"the runner of attempt {a.key} on {self.name} ended without "
                f"recording a result{killed}",
                "started_at": None,
                "ended_at": time.time(),
            }
            runner_files.write_json(a.dir / runner_files.RESULT, data, sync=True)
        self._follow(a)
        outcome = str(data.get("outcome", "lost"))
        exit_code = data.get("exit_code")
        a.result = AttemptResult(
            job_id=a.job_id,
            attempt=a.spec.attempt,
            outcome=outcome if outcome in OUTCOMES else "lost",
            ended_at=float(data.get("ended_at") or time.time()),
            exit_code=exit_code if isinstance(exit_code, int) else None,
            detail=str(data.get("detail", "")),
            started_at=data.get("started_at"),
            log_tail=tail(a.log_path, LOG_TAIL_BYTES) if a.spec.node_rank == 0 else None,
        )
        if a.result.succeeded and a.spec.node_rank == 0:
            done = Sample("progress", 1.0, time.time(), None, a.job_id, a.spec.attempt)
            self._samples.append(done)
        if a.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(a.pidfd)
            a.pidfd = None
        self._detach(a)
        log.info("%s: attempt %s ended: %s", self.name, a.key, a.result.detail)
        return True

    def _log_chunks(self, a: LocalAttempt, *, final: bool) -> list[LogChunk]:
        """The next pieces of ``a``'s log the portal does not have (one while it runs, up to
        ``LOG_CHUNKS_PER_SYNC`` once it ended)."""
        if a.log_sent < 0:
            a.log_sent = 0
        return read_log_chunks(
            a.job_id,
            a.spec.attempt,
            a.log_path,
            a.log_sent,
            LOG_CHUNKS_PER_SYNC if final else 1,
        )

    def _backlog_chunks(self) -> list[LogChunk]:
        """Chunks of ended attempts whose result the portal acknowledged before it had their
        whole log."""
        out: list[LogChunk] = []
        for key, (path, sent) in sorted(self._log_backlog.items()):
            out.extend(read_log_chunks(key.job_id, key.attempt, path, sent, LOG_CHUNKS_PER_SYNC))
        return out

    def _forget(self, a: LocalAttempt) -> None:
        """The portal has the result: drop the attempt's directory (what of its log the portal
        does not have yet goes on in later syncs)."""
        if a.spec.node_rank == 0 and a.log_sent >= 0 and a.log_sent < file_size(a.log_path):
            self._log_backlog[a.key] = (a.log_path, a.log_sent)
        self._attempts.pop(a.key, None)
        shutil.rmtree(a.dir, ignore_errors=True)

    def _open_pidfd(self, a: LocalAttempt) -> None:
        if a.runner_pid and a.pidfd is None:
            with contextlib.suppress(AttributeError, OSError):
                a.pidfd = os.pidfd_open(a.runner_pid)
