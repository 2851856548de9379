"""hetero_srtf's pairs (``scheduler.policies.hetero_srtf_pack``): the free hosts of a group."""

from __future__ import annotations

from scheduler.domain import JobSpec, Profile
from scheduler.policies.hetero_srtf_assign import Cand
from scheduler.policies.hetero_srtf_pack import _Hosts


def host(job_id: str, memory_mb: float) -> tuple[tuple[tuple[str, int], ...], Cand]:
    job = JobSpec(id=job_id, gpus=1, gpu_memory_mb=memory_mb, profile=Profile(name="p"))
    return ((f"n-{job_id}", 0),), Cand(job, {}, 0.0, 0.0)


def test_a_waiting_job_gets_the_first_untaken_host_its_memory_fits_beside() -> None:
    # Host order a (12 GB), b (4 GB), c (12 GB), d (4 GB) on a 16-GB model.
    hosts = _Hosts([host("a", 12_000), host("b", 4_000), host("c", 12_000), host("d", 4_000)])
    first = hosts.first_fit(2_000, 16_000)
    assert first is not None and first[2].job.id == "a"  # fits beside a: first in order
    big = hosts.first_fit(8_000, 16_000)
    assert big is not None and big[2].job.id == "b"  # a is too full for 8 GB
    hosts.take(big[0])
    big = hosts.first_fit(8_000, 16_000)
    assert big is not None and big[2].job.id == "d"  # b taken
    hosts.take(big[0])
    assert hosts.first_fit(8_000, 16_000) is None  # only 12-GB hosts left
    first = hosts.first_fit(2_000, 16_000)
    assert first is not None and first[2].job.id == "a"


def test_hosts_that_may_not_be_joined_are_passed_over_when_reached() -> None:
    # keys_of says None for b (say, its job may not share): b is never offered, in either
    # lookup, and a group with no joinable host has no first host.
    members = [host("a", 12_000), host("b", 4_000), host("c", 4_000)]

    def keys_of(keys: tuple[tuple[str, int], ...], h: Cand) -> tuple[tuple[str, int], ...] | None:
        return None if h.job.id == "b" else keys

    hosts = _Hosts(members, keys_of)
    first = hosts.first()
    assert first is not None and first.job.id == "a"
    big = hosts.first_fit(8_000, 16_000)
    assert big is not None and big[2].job.id == "c"
    hosts.take(big[0])
    assert hosts.first_fit(8_000, 16_000) is None
    assert _Hosts(members[1:2], keys_of).first() is None
    assert _Hosts(members[1:2], keys_of).first_fit(1_000, 16_000) is None
