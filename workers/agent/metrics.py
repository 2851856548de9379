"""Metric samples of a node (``Sampling``, a part of ``NodeAgent``): GPU readings, each attempt's
share of its GPUs, progress and the live Slow-Down."""

from __future__ import annotations

import logging
import time
from typing import Any

from workers.agent.attempt import LocalAttempt
from workers.gpu.attribution import AttemptProcesses, attribute
from workers.gpu.base import GpuBackendError
from workers.launcher import new_reports
from workers.protocol import JOB_GPU_MEMORY, JOB_GPU_UTIL, Sample
from workers.slowdown import live_slowdown

log = logging.getLogger(__name__)

MAX_BUFFERED_SAMPLES = 20_000  # kept while the portal cannot be reached (oldest dropped)


class Sampling:
    """The part of ``NodeAgent`` that reads its jobs' ``@cosched`` reports and takes metric
    samples, which ride on the next periodic sync. A mixin on the agent's state (``backend``,
    ``_attempts``, ``_samples``, ``sample_every_s``), set up in ``NodeAgent.__init__``."""

    # --- metrics ----------------------------------------------------------------------------------

    def _follow(self, a: LocalAttempt) -> None:
        """Read the job's new ``@cosched`` reports (progress, iterations, run time)."""
        reports, a.log_offset = new_reports(a.log_path, a.log_offset)
        for report in reports:
            if report.event == "start":
                a.run_s = _float(report.get("run_s")) or a.run_s
                a.resumed_from = _float(report.get("resumed_from")) or 0.0
            elif report.event in ("progress", "epoch", "done", "fail", "term"):
                fraction = _float(report.get("fraction"))
                if report.event == "done":
                    fraction = 1.0
                if fraction is not None:
                    a.progress = min(1.0, max(0.0, fraction))
                if "iter" in report.fields:
                    a.iters_done = _int(report.get("iter"))
                elif "steps" in report.fields:
                    a.iters_done = _int(report.get("steps"))
                a.iters_total = _int(report.get("iters")) or a.iters_total
                a.iter_time_s = _float(report.get("iter_time_s")) or a.iter_time_s
                a.active_s = _float(report.get("active_s")) or a.active_s
        if a.attached and a.progress is not None:
            self._virtual().set_progress(str(a.job_id), a.progress)

    def _sample_if_due(self) -> None:
        now_mono = time.monotonic()
        if now_mono - self._last_sample < self.sample_every_s:
            return
        self._last_sample = now_mono
        self._samples.extend(self.samples(time.time()))
        if len(self._samples) > MAX_BUFFERED_SAMPLES:
            del self._samples[: len(self._samples) - MAX_BUFFERED_SAMPLES]

    def samples(self, now: float) -> list[Sample]:
        """One round of readings: per GPU ``util_pct``, ``memory_used_mb``, ``memory_total_mb``;
        per running attempt and GPU the memory and SM utilisation of its own processes
        (``job_gpu_memory_mb``, ``job_gpu_util_pct``: ``workers.gpu.attribution``); per running
        attempt ``progress``, ``steps`` (iterations done, where the job counts them) and the
        live Slow-Down (ALGORITHMS.md §5)."""
        out: list[Sample] = []
        if self.backend is not None:
            try:
                readings = self.backend.sample(now)
            except GpuBackendError as exc:
                log.warning("%s: GPU sampling failed: %s", self.name, exc)
                readings = []
            procs = [
                AttemptProcesses(
                    key=a.key,
                    job_pid=a.job_pid,
                    runner_pid=a.runner_pid,
                    pgids=a.job_pgids,
                    cgroup=f"{self.marker}-job-{a.job_id}-{a.spec.attempt}",
                )
                for a in self._attempts.values()
                if a.result is None
            ]
            for r in readings:
                if r.util_pct is not None:
                    out.append(Sample("util_pct", float(r.util_pct), now, r.index))
                out.append(Sample("memory_used_mb", float(r.memory_used_mb), now, r.index))
                out.append(Sample("memory_total_mb", float(r.memory_total_mb), now, r.index))
                if not procs:
                    continue
                mine = attribute(r.index, r.process_memory_mb, r.process_util_pct, procs)
                for key, got in sorted(mine.items()):
                    job, attempt = key.job_id, key.attempt
                    out.append(Sample(JOB_GPU_MEMORY, got.memory_mb, now, r.index, job, attempt))
                    if got.util_pct is not None:
                        out.append(Sample(JOB_GPU_UTIL, got.util_pct, now, r.index, job, attempt))
        for a in self._attempts.values():
            if a.result is not None or a.spec.node_rank != 0:
                continue  # a gang's job figures come from its rank 0 only
            job, attempt = a.job_id, a.spec.attempt
            if a.progress is not None:
                out.append(Sample("progress", a.progress, now, None, job, attempt))
            if a.iters_done is not None:
                out.append(Sample("steps", float(a.iters_done), now, None, job, attempt))
            sd = live_slowdown(
                now,
                a.started_at,
                a.solo_time_s(),
                progress=a.progress,
                iters_done=a.iters_done,
                iters_total=a.iters_total,
                iter_time_s=a.iter_time_s,
                active_s=a.active_s,
            )
            if sd is not None:
                out.append(Sample("slowdown", float(sd), now, None, job, attempt))
        return out


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None
