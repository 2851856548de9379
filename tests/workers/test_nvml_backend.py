"""The nvml backend against the fake NVML module, and for real where NVML is missing (here)."""

from __future__ import annotations

import pytest

from tests.workers import fake_nvml
from tests.workers.fake_nvml import FakeGpu, FakeMig, FakeNvml
from workers.gpu import GpuBackend, GpuBackendError, NvmlUnavailable, open_backend
from workers.gpu.nvml_backend import NvmlBackend, catalogue_model


def two_v100s() -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu(
                name="Tesla V100-SXM2-16GB",
                uuid="GPU-aaaa",
                memory_used_mb=3000.0,
                util_pct=87,
                processes={4242: 2000.0, 4343: 1000.0},
            ),
            FakeGpu(name="Tesla V100-SXM2-16GB", uuid="GPU-bbbb", sm_count=None),
        ]
    )


def mig_a30() -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu(
                name="NVIDIA A30",
                uuid="GPU-a30",
                memory_total_mb=24576.0,
                memory_used_mb=1500.0,
                sm_count=56,
                mig_enabled=True,
                max_mig_slots=4,
                migs={
                    0: FakeMig(
                        "MIG-one", "NVIDIA A30 MIG 1g.6gb", 5952.0, 1000.0, 3, 0, {77: 900.0}
                    ),
                    2: FakeMig("MIG-two", "NVIDIA A30 MIG 2g.12gb", 11904.0, 500.0, 5, 0),
                },
            )
        ]
    )


def test_real_nvml_missing_gives_a_clear_error():
    # This machine has no NVIDIA driver: the real pynvml must fail to load libnvidia-ml.so.
    with pytest.raises(NvmlUnavailable) as info:
        NvmlBackend()
    message = str(info.value)
    assert "NVML is not available on this machine" in message
    assert "libnvidia-ml.so not found" in message
    assert "--backend virtual" in message


def test_factory_opens_nvml_and_reports_missing_library():
    with pytest.raises(NvmlUnavailable, match="libnvidia-ml.so"):
        open_backend("nvml")


def test_factory_rejects_unknown_backend():
    with pytest.raises(GpuBackendError, match="known: nvml, virtual"):
        open_backend("cuda")


def test_devices_map_names_to_catalogue_models():
    backend = NvmlBackend(nvml=two_v100s())
    assert isinstance(backend, GpuBackend)
    devices = backend.devices()
    assert [d.index for d in devices] == [0, 1]
    assert [d.uuid for d in devices] == ["GPU-aaaa", "GPU-bbbb"]
    assert devices[0].name == "Tesla V100-SXM2-16GB"
    assert devices[0].model == "V100"
    assert devices[0].memory_total_mb == pytest.approx(16160.0)
    assert devices[0].sm_count == 80
    # NVML cannot tell the SM count: the catalogue's is used
    assert devices[1].sm_count == 80
    assert not devices[0].mig_enabled and devices[0].mig_devices == ()
    assert devices[0].minor_number is None  # NVML cannot tell: the agent uses the index


def test_devices_carry_the_minor_number_of_their_device_node():
    fake = FakeNvml([FakeGpu(uuid="GPU-a", minor_number=3), FakeGpu(uuid="GPU-b", minor_number=0)])
    assert [d.minor_number for d in NvmlBackend(nvml=fake).devices()] == [3, 0]


def test_sample_reads_util_memory_and_per_process_memory():
    backend = NvmlBackend(nvml=two_v100s(), clock=lambda: 1234.5)
    first, second = backend.sample()
    assert first.timestamp == 1234.5
    assert first.util_pct == 87.0
    assert first.memory_used_mb == pytest.approx(3000.0)
    assert first.memory_total_mb == pytest.approx(16160.0)
    assert first.memory_free_mb == pytest.approx(13160.0)
    assert first.process_memory_mb == {4242: pytest.approx(2000.0), 4343: pytest.approx(1000.0)}
    assert second.process_memory_mb == {}
    assert backend.sample(now=99.0)[0].timestamp == 99.0


def test_processes_hidden_from_nvml_are_left_out():
    fake = FakeNvml([FakeGpu(processes={1: 512.0, 2: None})])
    assert NvmlBackend(nvml=fake).sample()[0].process_memory_mb == {1: pytest.approx(512.0)}


def test_mig_devices_are_listed_with_profiles_and_uuids():
    devices = NvmlBackend(nvml=mig_a30()).devices()
    (a30,) = devices
    assert a30.model == "A30" and a30.mig_enabled
    assert [(m.index, m.uuid, m.profile) for m in a30.mig_devices] == [
        (0, "MIG-one", "1g.6gb"),
        (2, "MIG-two", "2g.12gb"),
    ]
    assert a30.mig_devices[0].memory_total_mb == pytest.approx(5952.0)
    assert a30.mig_devices[0].gpu_instance_id == 3
    assert a30.mig_devices[1].compute_instance_id == 0


def test_mig_gpu_sample_has_no_util_but_memory_per_instance():
    (sample,) = NvmlBackend(nvml=mig_a30()).sample(now=1.0)
    assert sample.util_pct is None  # NVML answers NOT_SUPPORTED in MIG mode
    assert sample.memory_used_mb == pytest.approx(1500.0)
    assert sample.mig_memory_used_mb == {
        "MIG-one": pytest.approx(1000.0),
        "MIG-two": pytest.approx(500.0),
    }
    assert sample.process_memory_mb == {}  # the parent lists none here


def test_processes_come_from_mig_handles_when_the_parent_cannot_list_them():
    fake = mig_a30()
    fake.gpus[0].failing["nvmlDeviceGetComputeRunningProcesses"] = (
        fake_nvml.NVML_ERROR_NO_PERMISSION
    )
    fake.gpus[0].migs[2].processes = {88: 400.0, 77: 100.0}
    (sample,) = NvmlBackend(nvml=fake).sample()
    assert sample.process_memory_mb == {77: pytest.approx(1000.0), 88: pytest.approx(400.0)}


def test_gpu_without_mig_support_reports_mig_disabled():
    fake = FakeNvml([FakeGpu(mig_enabled=None, unsupported={"nvmlDeviceGetMaxMigDeviceCount"})])
    (device,) = NvmlBackend(nvml=fake).devices()
    assert device.mig_enabled is False and device.mig_devices == ()


def test_unknown_device_name_has_no_model():
    fake = FakeNvml([FakeGpu(name="NVIDIA L40S", sm_count=None)])
    (device,) = NvmlBackend(nvml=fake).devices()
    assert device.model is None and device.sm_count is None
    assert device.name == "NVIDIA L40S"


def test_unsupported_utilisation_is_none_not_an_error():
    fake = FakeNvml([FakeGpu(unsupported={"nvmlDeviceGetUtilizationRates"})])
    assert NvmlBackend(nvml=fake).sample()[0].util_pct is None


def test_a_lost_gpu_raises_a_backend_error_naming_the_gpu():
    fake = two_v100s()
    fake.gpus[1].failing["nvmlDeviceGetMemoryInfo"] = fake_nvml.NVML_ERROR_GPU_IS_LOST
    backend = NvmlBackend(nvml=fake)
    with pytest.raises(GpuBackendError, match="GPU 1: memory info failed: GpuIsLost"):
        backend.sample()


def test_an_unexpected_error_in_an_optional_call_is_not_swallowed():
    fake = two_v100s()
    fake.gpus[0].failing["nvmlDeviceGetUtilizationRates"] = fake_nvml.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(fake_nvml.NVMLError):
        NvmlBackend(nvml=fake).sample()


@pytest.mark.parametrize(
    ("code", "why"),
    [
        (fake_nvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so not found"),
        (fake_nvml.NVML_ERROR_DRIVER_NOT_LOADED, "the NVIDIA driver is not loaded"),
        (fake_nvml.NVML_ERROR_NO_PERMISSION, "no permission"),
    ],
)
def test_init_errors_say_nvml_is_unavailable(code, why):
    with pytest.raises(NvmlUnavailable, match=why):
        NvmlBackend(nvml=FakeNvml([], init_error=code))


def test_other_init_errors_are_backend_errors():
    with pytest.raises(GpuBackendError, match="NVML initialisation failed: Unknown") as info:
        NvmlBackend(nvml=FakeNvml([], init_error=fake_nvml.NVML_ERROR_UNKNOWN))
    assert not isinstance(info.value, NvmlUnavailable)


def test_fake_errors_map_codes_to_subclasses_like_pynvml():
    err = fake_nvml.NVMLError(fake_nvml.NVML_ERROR_NOT_SUPPORTED)
    assert type(err).__name__ == "NVMLError_NotSupported"
    assert isinstance(err, fake_nvml.NVMLError) and err.value == 3


def test_close_shuts_nvml_down_once_and_blocks_further_reads():
    fake = two_v100s()
    backend = NvmlBackend(nvml=fake)
    backend.close()
    backend.close()
    assert fake.shutdown_calls == 1
    with pytest.raises(GpuBackendError, match="closed"):
        backend.sample()


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("Tesla V100-SXM2-32GB", "V100"),
        ("Tesla V100-PCIE-16GB", "V100"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA GeForce RTX 2080 Ti", "RTX2080Ti"),
        ("NVIDIA TITAN Xp", "TitanXp"),
        ("Quadro RTX 6000", "QuadroRTX6000"),
        ("Tesla T4", "T4"),
        ("NVIDIA A30", "A30"),
        ("Tesla K80", "K80"),
        ("NVIDIA L4", None),
    ],
)
def test_catalogue_model_from_nvml_names(name, model):
    assert catalogue_model(name) == model


def test_a_gpu_missing_from_the_catalogue_registers_for_exclusive_use_and_says_so(caplog):
    """The first real-GPU gpu-check found an H200 registered without sharing modes, silently."""
    from workers.agent import device_row
    from workers.gpu.base import DeviceInfo

    known = device_row(DeviceInfo(0, "GPU-a", "NVIDIA H200", "H200", 143771.0, 132))
    assert "mps" in known["sharing_modes"] and "time_slicing" in known["sharing_modes"]
    with caplog.at_level("WARNING", logger="workers.agent"):
        row = device_row(DeviceInfo(1, "GPU-b", "NVIDIA Future X1", None, 200000.0, 200))
    assert "sharing_modes" not in row and row["model"] == "NVIDIA Future X1"
    assert "not in the GPU catalogue" in caplog.text and "exclusive use only" in caplog.text
