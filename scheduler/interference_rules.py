"""The interference contract: what every interference model answers, and how slowdowns compose.

``slowdown(job, co_runners, gpu, mode)`` returns a factor (unitless) by which the job's run
time grows next to ``co_runners`` on a GPU of model ``gpu``: the "interference value" of
ALGORITHMS.md §2 (co-run time / solo time). 1.0 means no interference; ``float("inf")`` means
the jobs cannot run together at all (measured as infeasible, e.g. out of memory). The models
themselves and their registry are ``scheduler.interference``; the learned model
(``scheduler.learning.interference``) and the simulator's sharing model
(``scheduler.simulator.sharing``) build on this module.

Convention by sharing mode (the simulator relies on it):

- ``EXCLUSIVE`` or no co-runners: always 1.0.
- ``MIG``: 1.0. Instances are hardware-isolated (memory, cache, SMs; §4 Table 1); that an
  instance is smaller than the whole GPU is a capacity question for the simulator, not
  interference.
- ``MPS``: the whole co-run slowdown. Jobs run concurrently, so co-run time / solo time is
  all the model's doing; the simulator runs the job at ``1 / slowdown`` of its solo speed.
- ``TIME_SLICING``: the *interference part only*. The simulator already shares time: with
  ``n`` jobs on the GPU each gets ``1/n`` of it (plus a context-switch overhead), so the model
  returns what comes on top of that: ``max(1, s / n)`` where ``s`` is the concurrent (MPS-like)
  slowdown the model would give and ``n = 1 + len(co_runners)``. Under time-slicing a job is
  never faster than its time share, and contexts do not overlap, so in practice this is 1.0
  unless the pair interferes more than plain time sharing would (cache and TLB thrashing).
  ``co_run_slowdown`` below composes the two into the total for callers that want one number.

Combining more than two jobs: the data (Gavel) and the class rules (§4) are pairwise. For a job
with several co-runners we add the pairwise excesses: ``1 + sum(s_pair - 1)``. Each co-runner
steals its own share of the job's progress; summing is the first-order approximation. It is
exact for one co-runner, pessimistic next to a product for small slowdowns only by second-order
terms, and never lower than the worst single pair (taking the max would ignore the others).
Any infeasible pair makes the whole group infeasible (``inf``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from scheduler.domain import GpuSpec, JobSpec, SharingMode


class InterferenceError(ValueError):
    """An interference model was named or configured wrongly."""


class InterferenceModel(Protocol):
    name: str

    def slowdown(
        self, job: JobSpec, co_runners: Sequence[JobSpec], gpu: GpuSpec, mode: SharingMode
    ) -> float:
        """Co-run time / solo time of ``job`` on ``gpu`` next to ``co_runners`` under ``mode``
        (the interference part only under time-slicing; see the module docstring)."""
        ...


def combine_pairwise(pair_slowdowns: Sequence[float]) -> float:
    """Slowdown next to several co-runners from the pairwise ones: ``1 + sum(s - 1)``.

    Empty -> 1.0; any ``inf`` -> ``inf``. See the module docstring for why the sum.
    """
    total = 1.0
    for s in pair_slowdowns:
        if math.isinf(s):
            return math.inf
        total += s - 1.0
    return total


def apply_mode(concurrent_slowdown: float, n_jobs: int, mode: SharingMode) -> float:
    """Turn a concurrent (MPS-like) slowdown into what ``slowdown`` returns under ``mode``.

    ``n_jobs`` counts the job itself and its co-runners. EXCLUSIVE and MIG: 1.0; MPS: as is;
    TIME_SLICING: ``max(1, s / n_jobs)``, the part on top of the time share.
    """
    if n_jobs <= 1 or mode in (SharingMode.EXCLUSIVE, SharingMode.MIG):
        return 1.0
    if mode == SharingMode.TIME_SLICING:
        if math.isinf(concurrent_slowdown):
            return math.inf
        return max(1.0, concurrent_slowdown / n_jobs)
    return concurrent_slowdown


def co_run_slowdown(
    model: InterferenceModel,
    job: JobSpec,
    co_runners: Sequence[JobSpec],
    gpu: GpuSpec,
    mode: SharingMode,
    *,
    context_switch_overhead: float = 0.0,
) -> float:
    """Total co-run time / solo time of ``job``, time share included.

    Under TIME_SLICING: ``n * (1 + context_switch_overhead) * model.slowdown(...)`` with ``n``
    jobs on the GPU (``context_switch_overhead`` is a fraction, e.g. 0.05 = 5 %); otherwise the
    model's value. For explanations and for callers that want one number.
    """
    part = model.slowdown(job, co_runners, gpu, mode)
    if mode == SharingMode.TIME_SLICING and co_runners:
        return (1 + len(co_runners)) * (1.0 + context_switch_overhead) * part
    return part
