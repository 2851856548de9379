"""Applying MIG layouts through the nvml backend, against the fake NVML module."""

from __future__ import annotations

import pytest

from tests.workers import fake_nvml
from tests.workers.fake_nvml import A30_GI_PROFILES, FakeGpu, FakeMig, FakeNvml
from workers.gpu import GpuBackendError
from workers.gpu.nvml_backend import NvmlBackend


def a30(enabled=True, **kw) -> FakeNvml:
    gpu = FakeGpu(
        name="NVIDIA A30",
        uuid="GPU-a30",
        memory_total_mb=24576.0,
        sm_count=56,
        mig_enabled=enabled,
        max_mig_slots=4,
        gi_profiles=dict(A30_GI_PROFILES),
        **kw,
    )
    return FakeNvml([gpu])


def test_creates_the_layout_and_lists_the_instances():
    fake = a30()
    backend = NvmlBackend(nvml=fake)
    report = backend.apply_mig_layout(0, ["1g.6gb", "2g.12gb", "1g.6gb"])
    assert report.applied and sorted(report.created) == ["1g.6gb", "1g.6gb", "2g.12gb"]
    assert fake.created == ["2g.12gb", "1g.6gb", "1g.6gb"]  # widest first
    profiles = sorted(m.profile for m in backend.devices()[0].mig_devices)
    assert profiles == ["1g.6gb", "1g.6gb", "2g.12gb"]
    assert all(m.uuid.startswith("MIG-fake-") for m in report.instances)
    assert "3 created, 0 destroyed, 0 kept" in report.message


def test_relayout_keeps_what_fits_and_destroys_the_rest():
    fake = a30()
    backend = NvmlBackend(nvml=fake)
    backend.apply_mig_layout(0, ["2g.12gb", "1g.6gb", "1g.6gb"])
    report = backend.apply_mig_layout(0, ["2g.12gb", "2g.12gb"])
    assert sorted(report.destroyed) == ["1g.6gb", "1g.6gb"] and report.created == ("2g.12gb",)
    assert sorted(m.profile for m in report.instances) == ["2g.12gb", "2g.12gb"]


def test_refuses_to_destroy_an_instance_with_a_process():
    busy = FakeMig("MIG-busy", "NVIDIA A30 MIG 4g.24gb", 23808.0, 500.0, 7, 0, {4242: 500.0})
    backend = NvmlBackend(nvml=a30(migs={0: busy}))
    with pytest.raises(GpuBackendError, match=r"run processes \(MIG-busy: pids 4242\)"):
        backend.apply_mig_layout(0, ["1g.6gb"])


def test_invalid_layouts_are_refused_before_touching_the_gpu():
    fake = a30()
    backend = NvmlBackend(nvml=fake)
    with pytest.raises(GpuBackendError, match=r"GPU 0 \(NVIDIA A30\): .*6 compute slices"):
        backend.apply_mig_layout(0, ["4g.24gb", "2g.12gb"])
    with pytest.raises(GpuBackendError, match="no MIG profile '3g.20gb'"):
        backend.apply_mig_layout(0, ["3g.20gb"])
    assert fake.created == []


def test_mig_mode_off_is_switched_on_and_waits_for_a_reset():
    fake = a30(enabled=False)
    backend = NvmlBackend(nvml=fake)
    report = backend.apply_mig_layout(0, ["4g.24gb"])
    assert not report.applied and "nvidia-smi -r -i 0" in report.message
    assert fake.gpus[0].mig_pending is True and fake.created == []
    fake.reset(0)
    assert backend.apply_mig_layout(0, ["4g.24gb"]).applied


def test_driver_refusals_come_back_clearly():
    no_root = a30(failing={"nvmlDeviceCreateGpuInstance": fake_nvml.NVML_ERROR_NO_PERMISSION})
    with pytest.raises(GpuBackendError, match="needs root"):
        NvmlBackend(nvml=no_root).apply_mig_layout(0, ["1g.6gb"])
    full = a30(mig_slices=1)  # the driver has room for one slice only
    with pytest.raises(GpuBackendError, match="no room"):
        NvmlBackend(nvml=full).apply_mig_layout(0, ["2g.12gb"])
    v100 = FakeNvml([FakeGpu()])
    with pytest.raises(GpuBackendError, match="this model has no MIG"):
        NvmlBackend(nvml=v100).apply_mig_layout(0, ["1g.5gb"])
    unsupported = a30(enabled=None)
    with pytest.raises(GpuBackendError, match="no MIG support"):
        NvmlBackend(nvml=unsupported).apply_mig_layout(0, ["1g.6gb"])
