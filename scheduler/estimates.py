"""Noisy work estimates: what a policy sees when users declare their work only roughly.

A job's profile times (``gpu_time_s`` per model, its unconsolidated times, ``cpu_time_s``) are
the scheduler's *estimates* (throughput x declared work). ``with_noisy_estimates`` multiplies
every time of a job by one lognormal factor ``exp(N(0, sigma))`` (seeded; the same job gets the
same factor for every GPU model: the user misjudged the work, not the GPU) and returns, beside
the noisy jobs, the truth as a separate map: job id -> true / estimated work. The map goes to
the simulator's engine (``simulate(..., true_work=...)``, or ``SimConfig.estimate_noise``,
which draws it inside the engine), never into ``JobSpec``: policies cannot read it. The
simulator runs each job for its true work and reports progress as done / declared work, as a
live job counting its steps against ``total_steps`` would.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence

from scheduler.domain import JobSpec, Profile


def _scaled(prof: Profile, factor: float) -> Profile:
    """``prof`` with every time (GPU models, spread, CPU) multiplied by ``factor``."""
    return dataclasses.replace(
        prof,
        gpu_time_s={m: t * factor for m, t in prof.gpu_time_s.items()},
        gpu_time_unconsolidated_s={
            m: t * factor for m, t in prof.gpu_time_unconsolidated_s.items()
        },
        cpu_time_s=None if prof.cpu_time_s is None else prof.cpu_time_s * factor,
    )


def with_noisy_estimates(
    jobs: Sequence[JobSpec], sigma: float, seed: int
) -> tuple[list[JobSpec], dict[str, float]]:
    """(``jobs`` with each job's profile times multiplied by its own lognormal noise factor,
    job id -> true / estimated work for the jobs that changed).

    ``sigma`` is the standard deviation of the factor's logarithm (0: unchanged copies and an
    empty map); ``seed`` seeds the factors (one draw per job, in trace order).
    """
    if not 0 <= sigma <= 10 or math.isnan(sigma):
        raise ValueError(f"estimate noise sigma must be in [0, 10], got {sigma!r}")
    rng = random.Random(seed)
    out = []
    truth: dict[str, float] = {}
    for job in jobs:
        noise = math.exp(rng.gauss(0.0, sigma)) if sigma > 0 else 1.0
        prof = job.profile
        if prof is None or noise == 1.0:
            out.append(job)
            continue
        truth[job.id] = 1.0 / noise
        out.append(dataclasses.replace(job, profile=_scaled(prof, noise)))
    return out, truth


#: The length a job that declared none is given in its profile: its fastest model's time.
NOMINAL_LENGTH_S = 3600.0


def with_hidden_lengths(
    jobs: Sequence[JobSpec], share: float, seed: int, *, nominal_s: float = NOMINAL_LENGTH_S
) -> tuple[list[JobSpec], dict[str, float]]:
    """(``jobs`` where a seeded ``share`` of them declare no length, job id -> true / declared
    work for those).

    A chosen job keeps its profile's *relative* speeds per GPU model, scaled so that its
    fastest model takes ``nominal_s``, and gets ``length_known=False``: a policy sees how much
    faster it runs on one GPU than on another (the application's measured throughput) but not
    how long it runs. The map is the truth the engine runs (``simulate(..., true_work=...)``),
    never a policy's. Jobs without GPU times are left as they are.
    """
    if not 0 <= share <= 1 or math.isnan(share):
        raise ValueError(f"hidden-length share must be in [0, 1], got {share!r}")
    if not 0 < nominal_s < math.inf:
        raise ValueError(f"nominal length must be > 0, got {nominal_s!r}")
    rng = random.Random(f"hide-lengths:{seed}")
    out = []
    truth: dict[str, float] = {}
    for job in jobs:
        hide = rng.random() < share  # one draw per job, in trace order
        prof = job.profile
        fastest = min((t for t in prof.gpu_time_s.values() if t > 0), default=0.0) if prof else 0
        if not hide or prof is None or fastest <= 0:
            out.append(job)
            continue
        scale = nominal_s / fastest
        truth[job.id] = 1.0 / scale
        out.append(dataclasses.replace(job, profile=_scaled(prof, scale), length_known=False))
    return out, truth
