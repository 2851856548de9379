"""Which attempt a GPU process belongs to: per-job GPU readings from per-process ones.

NVML lists the processes that hold memory on a GPU (``nvmlDeviceGetComputeRunningProcesses``)
and, where the GPU supports it, samples each process's SM utilisation
(``nvmlDeviceGetProcessUtilization``). The node agent files each such process under the attempt
it belongs to, tried in this order:

1. **cgroup**: the process's cgroup v2 path (``/proc/<pid>/cgroup``) ends in the attempt's own
   cgroup (``<marker>-job-<id>-<attempt>``, ``workers.isolation.Limits.for_job``), or lies
   under it;
2. **process group**: the process's group is one of the attempt's (one per rank);
3. **process tree**: walking up its parents reaches the attempt's job or runner process.

A process of nobody's (another user's, a driver daemon such as ``nvidia-cuda-mps-server``) is
left out. Everything here reads ``/proc`` only (``proc`` overrides it in tests).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

MAX_DEPTH = 64  # parents walked up from one process


@dataclass(frozen=True, slots=True)
class AttemptProcesses:
    """What identifies one attempt's processes on this node."""

    key: Hashable
    job_pid: int | None = None
    runner_pid: int | None = None
    pgids: tuple[int, ...] = ()
    cgroup: str | None = None  # the attempt's cgroup directory name (last path component)


@dataclass(frozen=True, slots=True)
class JobGpuReading:
    """One attempt's share of one GPU: memory its processes hold (MB), their summed SM
    utilisation (percent; None where the GPU gives no per-process samples) and the pids."""

    gpu_index: int
    memory_mb: float
    util_pct: float | None
    pids: tuple[int, ...] = field(default=())


def _stat(pid: int, proc: Path) -> tuple[int, int] | None:
    """(parent pid, process group) of ``pid``, or None if it is gone."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = text[text.rfind(")") + 2 :].split()
    try:
        return int(rest[1]), int(rest[2])
    except (IndexError, ValueError):
        return None


def _cgroup(pid: int, proc: Path) -> str | None:
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip()
    return None


def owner_of(pid: int, attempts: Iterable[AttemptProcesses], proc: Path) -> Hashable | None:
    """The key of the attempt that process ``pid`` belongs to (module docstring), or None."""
    attempts = list(attempts)
    path = _cgroup(pid, proc)
    if path:
        parts = path.split("/")
        for a in attempts:
            if a.cgroup and a.cgroup in parts:
                return a.key
    stat = _stat(pid, proc)
    if stat is None:
        return None
    for a in attempts:
        if stat[1] in a.pgids:
            return a.key
    roots = {}
    for a in attempts:
        for root in (a.job_pid, a.runner_pid):
            if root:
                roots[root] = a.key
    current, depth = pid, 0
    while current > 1 and depth < MAX_DEPTH:
        if current in roots:
            return roots[current]
        step = _stat(current, proc)
        if step is None:
            return None
        current, depth = step[0], depth + 1
    return None


def attribute(
    gpu_index: int,
    process_memory_mb: Mapping[int, float],
    process_util_pct: Mapping[int, float],
    attempts: Iterable[AttemptProcesses],
    proc: Path | str = "/proc",
) -> dict[Hashable, JobGpuReading]:
    """Per attempt key, its reading of GPU ``gpu_index`` from the per-process figures. An
    attempt with processes on the GPU but no utilisation sample reads 0 % when the GPU gives
    samples for others (it was idle), None when it gives none at all."""
    proc = Path(proc)
    attempts = list(attempts)
    memory: dict[Hashable, float] = {}
    util: dict[Hashable, float] = {}
    pids: dict[Hashable, list[int]] = {}
    for pid in sorted(set(process_memory_mb) | set(process_util_pct)):
        key = owner_of(pid, attempts, proc)
        if key is None:
            continue
        pids.setdefault(key, []).append(pid)
        memory[key] = memory.get(key, 0.0) + float(process_memory_mb.get(pid, 0.0))
        if pid in process_util_pct:
            util[key] = util.get(key, 0.0) + float(process_util_pct[pid])
    sampled = bool(process_util_pct)
    return {
        key: JobGpuReading(
            gpu_index=gpu_index,
            memory_mb=memory.get(key, 0.0),
            util_pct=min(100.0, util.get(key, 0.0)) if sampled else None,
            pids=tuple(found),
        )
        for key, found in pids.items()
    }
