"""MIG layouts on the virtual backend: stable instance UUIDs, kept when in use."""

from __future__ import annotations

import pytest

from scheduler.domain import Profile, SharingMode
from workers.gpu import GpuBackendError
from workers.gpu.virtual_backend import VirtualBackend

P = Profile("p", gpu_memory_max_mb=1000)
MIG = SharingMode.MIG


def test_layout_lists_free_and_used_instances_with_stable_uuids():
    backend = VirtualBackend("A30x2", node="v")
    report = backend.apply_mig_layout(1, ["1g.6gb", "1g.6gb", "2g.12gb"])
    assert report.applied and sorted(report.created) == ["1g.6gb", "1g.6gb", "2g.12gb"]
    before = {m.uuid: m.profile for m in backend.devices()[1].mig_devices}
    assert len(before) == 3 and all(u.startswith("MIG-virtual-v-1-") for u in before)
    assert backend.devices()[1].mig_enabled and not backend.devices()[0].mig_enabled
    a = backend.attach("a", 1, P, MIG, mig_profile="1g.6gb")
    b = backend.attach("b", 1, P, MIG, mig_profile="1g.6gb")
    assert {a.mig_uuid, b.mig_uuid} <= set(before) and a.mig_uuid != b.mig_uuid
    assert {m.uuid: m.profile for m in backend.devices()[1].mig_devices} == before
    backend.detach("a")
    c = backend.attach("c", 1, P, MIG, mig_profile="1g.6gb")
    assert c.mig_uuid == a.mig_uuid  # the freed instance is reused


def test_relayout_keeps_instances_in_use_and_refuses_to_drop_them():
    backend = VirtualBackend("A30", node="v")
    backend.apply_mig_layout(0, ["2g.12gb", "2g.12gb"])
    job = backend.attach("a", 0, P, MIG, mig_profile="2g.12gb")
    report = backend.apply_mig_layout(0, ["2g.12gb", "1g.6gb", "1g.6gb"])
    assert report.destroyed == ("2g.12gb",) and report.created == ("1g.6gb", "1g.6gb")
    assert job.mig_uuid in {m.uuid for m in report.instances}
    with pytest.raises(GpuBackendError, match="drops the 2g.12gb instance .* in use by job a"):
        backend.apply_mig_layout(0, ["1g.6gb"] * 4)
    with pytest.raises(GpuBackendError, match="6 compute slices"):
        backend.apply_mig_layout(0, ["4g.24gb", "2g.12gb"])


def test_instances_are_created_on_demand_within_the_slices():
    backend = VirtualBackend("A30", node="v")
    backend.attach("a", 0, P, MIG, mig_profile="2g.12gb")
    backend.attach("b", 0, P, MIG, mig_profile="2g.12gb")
    with pytest.raises(GpuBackendError, match="no room for a 1g.6gb instance"):
        backend.attach("c", 0, P, MIG, mig_profile="1g.6gb")
    assert "c" not in backend.jobs
