"""A lower bound on the average job completion time that any policy can reach on a trace.

The comparison of ``python -m scheduler.reproduce peers`` states its goals as ratios to the
best peer (e.g. average JCT <= 0.90x). Whether such a ratio can be reached at all depends on
the trace: at light load every policy runs nearly every job at once on a fast GPU, and no
policy can finish a job sooner than its own run time. This module computes, from the true job
lengths, a figure no schedule in the simulator can beat, so that a ratio is read against it.

Two bounds; the larger one holds (both are valid for every schedule):

- **Per job.** Job ``j`` cannot finish before its arrival ``a_j``, plus the wait for the first
  decision round at or after it (``round_s``: the engine decides at ``0, R, 2R, ...`` only),
  plus its run time on its fastest model (``JobSpec.run_time_s``, consolidated where a node
  holds its GPUs, spread over nodes where none does). Sharing never speeds a job up in the
  simulator (every measured slowdown is >= 1) and restarts only add time.
- **Pooled.** Every GPU of the cluster fused into one machine: job ``j`` carries
  ``gpus_j * best_j`` seconds of work in units of its fastest model, a GPU of model ``m`` does
  at most ``c_m = max_j best_j / t_jm`` of such work per second (for any job), so the cluster
  does at most ``sum_m count_m * c_m`` per second. On one machine with release times,
  preemptive shortest-remaining-work-first minimises the sum of completion times, and every
  schedule on the real cluster is a schedule on the fused machine.

A job that no model of the cluster can run (no time for any model with enough GPUs) counts
only its wait for the first round. The bound ignores memory limits (allowing more models only
lowers it) and any node's CPU cores.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.cluster_spec import ClusterSpec
from scheduler.domain import JobSpec


@dataclass(frozen=True)
class JctBound:
    """The two bounds on the average JCT (seconds) and the larger, which holds."""

    per_job_s: float
    pooled_s: float
    jobs: int

    @property
    def avg_jct_s(self) -> float:
        return max(self.per_job_s, self.pooled_s)


def first_round_s(arrival_s: float, round_s: float | None) -> float:
    """The first decision time at or after ``arrival_s`` (rounds at multiples of ``round_s``;
    None or 0: decisions on arrival)."""
    if not round_s:
        return arrival_s
    return math.ceil(arrival_s / round_s) * round_s


def srpt_total_completion_s(
    release_s: Sequence[float], work: Sequence[float], speed: float
) -> float:
    """The sum of completion times of preemptive shortest-remaining-work-first on one machine
    of ``speed`` (work per second), each job available from its release time: the least sum
    any schedule on that machine reaches."""
    if speed <= 0:
        raise ValueError("speed must be > 0")
    order = sorted(range(len(release_s)), key=lambda i: release_s[i])
    heap: list[tuple[float, int]] = []
    t = 0.0
    total = 0.0
    i, n = 0, len(order)
    while i < n or heap:
        if not heap:
            t = max(t, release_s[order[i]])
        while i < n and release_s[order[i]] <= t:
            heapq.heappush(heap, (work[order[i]], order[i]))
            i += 1
        left, j = heap[0]
        next_release = release_s[order[i]] if i < n else math.inf
        if t + left / speed <= next_release:
            t += left / speed
            heapq.heappop(heap)
            total += t
        else:
            heapq.heapreplace(heap, (left - (next_release - t) * speed, j))
            t = next_release
    return total


def avg_jct_lower_bound(
    jobs: Sequence[JobSpec], cluster: ClusterSpec, round_s: float | None = None
) -> JctBound:
    """The lower bounds of the module docstring for ``jobs`` (their true lengths) on
    ``cluster``, decisions every ``round_s`` seconds (None: on events)."""
    counts: dict[str, int] = {}
    per_node: dict[str, int] = {}
    for node in cluster.nodes:
        if node.gpu_model is not None and node.gpu_count > 0:
            m = node.gpu_model
            counts[m] = counts.get(m, 0) + node.gpu_count
            per_node[m] = max(per_node.get(m, 0), node.gpu_count)
    if not jobs:
        return JctBound(0.0, 0.0, 0)
    best: list[float] = []
    ratio = dict.fromkeys(counts, 0.0)  # c_m: the most best-model work a GPU of m does per s
    for job in jobs:
        k = max(1, job.gpus)
        times: dict[str, float] = {}
        if job.gpus > 0:
            for m, c in counts.items():
                if c < k:
                    continue
                t = job.run_time_s(m, spread=k > per_node[m])
                if t is not None and t > 0:
                    times[m] = t
        b = min(times.values()) if times else 0.0
        best.append(b)
        for m, t in times.items():
            ratio[m] = max(ratio[m], b / t)
    release = [first_round_s(j.arrival_s, round_s) for j in jobs]
    arrivals = sum(j.arrival_s for j in jobs)
    per_job = sum(release) + sum(best) - arrivals
    capacity = sum(counts[m] * ratio[m] for m in counts)
    work = [max(1, j.gpus) * b for j, b in zip(jobs, best, strict=True)]
    if capacity > 0:
        pooled = srpt_total_completion_s(release, work, capacity) - arrivals
    else:
        pooled = sum(release) - arrivals
    n = len(jobs)
    return JctBound(per_job / n, pooled / n, n)
