"""hetero_srtf's choice of GPU model (``scheduler.policies.hetero_srtf_assign``)."""

from __future__ import annotations

from scheduler.domain import JobSpec, Profile
from scheduler.policies.hetero_srtf_assign import Cand, assign_models


def gjob(job_id: str, times: dict[str, float]) -> JobSpec:
    return JobSpec(id=job_id, gpus=1, profile=Profile(name=f"p-{job_id}", gpu_time_s=times))


def test_assign_models_gives_the_fast_gpu_to_the_job_that_gains_most() -> None:
    # a is first in priority but barely faster on V100; b is 10x faster there.
    a = Cand(gjob("a", {"V100": 100.0, "K80": 120.0}), {"V100": 100.0, "K80": 120.0}, 100.0, 1.0)
    b = Cand(gjob("b", {"V100": 100.0, "K80": 1000.0}), {"V100": 100.0, "K80": 1000.0}, 100.0, 2.0)
    assert assign_models([a, b], {"V100": 1, "K80": 1}) == {"a": "K80", "b": "V100"}
    # Capacity is respected: one model only, one GPU -> only the first job.
    assert assign_models([a, b], {"V100": 1}) == {"a": "V100"}


def cand(job_id: str, times: dict[str, float], key: float) -> Cand:
    return Cand(gjob(job_id, times), dict(times), min(times.values()), key)


def test_a_swap_takes_the_job_that_loses_least_even_when_it_loses_something() -> None:
    # a and b take the V100s first (keys 1, 2); c is left the K80, where it is 10x slower.
    # Swapping c with b (the V100 job that loses least on the K80: 5 %) pays; a stays.
    a = cand("a", {"V100": 100.0, "K80": 110.0}, 1.0)
    b = cand("b", {"V100": 100.0, "K80": 105.0}, 2.0)
    c = cand("c", {"V100": 100.0, "K80": 1000.0}, 3.0)
    got = assign_models([a, b, c], {"V100": 2, "K80": 1})
    assert got == {"a": "V100", "b": "K80", "c": "V100"}
