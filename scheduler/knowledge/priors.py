"""Pair priors: what the scheduler believes of co-run speeds before a pair has run.

``truth_pair_prior`` is the simulator's: the interference model the simulator runs with (its
truth), seen through seeded lognormal noise ``exp(N(0, noise))`` per (GPU model, mode, job
type, co-runner types), as a pair table measured offline on other hardware or inputs would be.
``noise`` 0 is an oracle (the exact table). With the Gavel table (``measured``) a pair the
table does not hold, in particular any pair of multi-GPU jobs (Gavel measured single-GPU pairs
only), has no prior: the policy learns it only by running it. Policies never call this; they
read ``Knowledge.co_run_speed``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from scheduler.domain import JobSpec, SharingMode
from scheduler.interference import apply_mode, combine_pairwise
from scheduler.knowledge.estimator import PairPrior


def _noise(seed: int, sigma: float, key: str) -> float:
    if sigma <= 0:
        return 1.0
    return math.exp(random.Random(f"{seed}|{key}").gauss(0.0, sigma))


def truth_pair_prior(
    interference: Any,
    cluster: Any,
    *,
    noise: float = 0.0,
    seed: int = 0,
    context_switch_overhead: float = 0.0,
) -> PairPrior:
    """A ``PairPrior`` from ``interference`` (an ``InterferenceModel``; None: no prior at
    all) on the GPU models of ``cluster`` (a ``ClusterSpec``), with noise (see the
    module docstring). Returns the co-run speed over the solo speed, time share included."""
    specs: dict[str, Any] = {}

    def prior(
        job: JobSpec, co_runners: Sequence[JobSpec], gpu_model: str, mode: SharingMode
    ) -> float | None:
        if not co_runners or mode in (SharingMode.EXCLUSIVE, SharingMode.MIG):
            return None
        spec = specs.get(gpu_model)
        if spec is None:
            try:
                spec = specs[gpu_model] = cluster.gpu_spec(gpu_model)
            except (KeyError, ValueError):
                return None
        n = 1 + len(co_runners)
        if interference is None:
            return None  # no model of interference: nothing to start from
        if hasattr(interference, "measured_pair"):
            if job.gpus > 1 or any(c.gpus > 1 for c in co_runners):
                return None  # Gavel measured single-GPU pairs only
            pairs = [interference.measured_pair(job, c, spec) for c in co_runners]
            if any(s is None for s in pairs):
                return None  # never measured: no prior
            part = apply_mode(combine_pairwise([float(s) for s in pairs]), n, mode)
        else:
            part = float(interference.slowdown(job, co_runners, spec, mode))
        if not math.isfinite(part) or part <= 0:
            return 0.0 if math.isinf(part) else None
        part = max(1.0, part)
        speed = 1.0 / part
        if mode == SharingMode.TIME_SLICING:
            speed /= n * (1.0 + context_switch_overhead)
        others = ",".join(sorted(c.type_key() for c in co_runners))
        key = f"{gpu_model}|{mode}|{job.type_key()}|{others}"
        return speed * _noise(seed, noise, key)

    return prior


class _Catalogue:
    """Looks GPU specs up in the catalogue (``scheduler.catalog``) by model name."""

    @staticmethod
    def gpu_spec(model: str) -> Any:
        from scheduler.catalog import gpu_spec

        return gpu_spec(model)


def table_pair_prior() -> PairPrior:
    """The Gavel pair table (``measured``) as a prior, without noise: what a live cluster
    starts from (measured offline, on other hardware and inputs), and what a policy handed no
    ``Knowledge`` falls back to."""
    from scheduler.interference import MeasuredInterference

    return truth_pair_prior(MeasuredInterference(), _Catalogue())
