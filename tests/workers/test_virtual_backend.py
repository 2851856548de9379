"""The virtual GPU backend: readings that follow the attached jobs' profiles."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from scheduler.domain import GpuSpec, JobSpec, MemoryStep, Profile, SharingMode
from workers.gpu import GpuBackend, GpuBackendError, open_backend
from workers.gpu.virtual_backend import VirtualBackend, parse_gpu_spec

# LAMMPS's memory steps from ALGORITHMS.md §1 (step1 0-833 MB ... step4 2795-8317 MB)
LAMMPS = Profile(
    name="lammps",
    gpu_util_pct=60.0,
    memory_steps=(
        MemoryStep(0.0, 0.0, 833.0),
        MemoryStep(0.25, 833.0, 1895.0),
        MemoryStep(0.5, 1895.0, 2795.0),
        MemoryStep(0.75, 2795.0, 8317.0),
    ),
)
CNN = Profile(name="cnn", gpu_util_pct=70.0, gpu_memory_avg_mb=1228.0, gpu_memory_max_mb=1500.0)
SMALL = Profile(name="small", gpu_util_pct=20.0, gpu_memory_max_mb=100.0)


class FixedInterference:
    """An InterferenceModel-shaped object: every co-located job runs ``factor`` times slower."""

    name = "fixed"

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.calls: list[tuple[str, tuple[str, ...], str, SharingMode]] = []

    def slowdown(
        self, job: JobSpec, co_runners: Sequence[JobSpec], gpu: GpuSpec, mode: SharingMode
    ) -> float:
        self.calls.append((job.id, tuple(j.id for j in co_runners), gpu.model, mode))
        return self.factor


def test_spec_strings_and_lists_give_catalogue_models():
    assert parse_gpu_spec("V100x2") == ["V100", "V100"]
    assert parse_gpu_spec("v100*2 + TitanXp, a30") == ["V100", "V100", "TitanXp", "A30"]
    assert parse_gpu_spec(["V100", "tesla t4"]) == ["V100", "T4"]
    with pytest.raises(GpuBackendError, match="unknown GPU model 'Z9'"):
        parse_gpu_spec("Z9x2")
    with pytest.raises(GpuBackendError, match="at least one"):
        parse_gpu_spec("")


def test_devices_come_from_the_catalogue():
    backend = open_backend("virtual", models="V100,A30", node="gpu-1")
    assert isinstance(backend, GpuBackend)
    v100, a30 = backend.devices()
    assert (v100.index, v100.model, v100.memory_total_mb, v100.sm_count) == (0, "V100", 16160, 80)
    assert v100.uuid == "GPU-virtual-gpu-1-0" and v100.name == "virtual V100"
    assert a30.model == "A30" and not a30.mig_enabled


def test_idle_gpus_read_zero():
    (sample,) = VirtualBackend(["V100"], clock=lambda: 42.0).sample()
    assert (sample.timestamp, sample.util_pct, sample.memory_used_mb) == (42.0, 0.0, 0.0)
    assert sample.memory_total_mb == 16160.0


def test_memory_follows_the_steps_as_progress_advances():
    backend = VirtualBackend("V100")
    backend.attach("j1", 0, LAMMPS, "exclusive", started_at=0.0, pid=500)
    readings = []
    for progress in (0.0, 0.125, 0.25, 0.5, 0.75, 0.875, 1.0):
        backend.set_progress("j1", progress)
        readings.append(backend.sample(now=0.0)[0].memory_used_mb)
    assert readings == pytest.approx([0.0, 416.5, 833.0, 1895.0, 2795.0, 5556.0, 8317.0])
    sample = backend.sample(now=0.0)[0]
    assert sample.job_memory_mb == {"j1": pytest.approx(8317.0)}
    assert sample.process_memory_mb == {500: pytest.approx(8317.0)}
    assert sample.util_pct == 60.0


def test_without_steps_memory_is_the_profile_average():
    backend = VirtualBackend("V100")
    backend.attach("j1", 0, CNN)
    assert backend.sample(now=0)[0].memory_used_mb == 1228.0


def test_paused_jobs_keep_memory_and_give_no_utilisation():
    backend = VirtualBackend("V100")
    backend.attach("a", 0, CNN, "time_slicing", 0.0)
    backend.attach("b", 0, SMALL, "time_slicing", 0.0)
    assert backend.sample(now=0)[0].util_pct == 90.0
    backend.set_paused("a", True)
    sample = backend.sample(now=0)[0]
    assert sample.util_pct == 20.0
    assert sample.memory_used_mb == pytest.approx(1328.0)
    backend.set_paused("a", False)
    assert backend.sample(now=0)[0].util_pct == 90.0


def test_shared_utilisation_is_capped_at_100():
    backend = VirtualBackend("V100")
    backend.attach("a", 0, CNN, "time_slicing", 0.0)
    backend.attach("b", 0, LAMMPS, "time_slicing", 0.0)
    assert backend.sample(now=0)[0].util_pct == 100.0


def test_detach_frees_memory_and_other_gpus_are_untouched():
    backend = VirtualBackend("V100x2")
    backend.attach("a", 0, CNN)
    backend.attach("b", 1, SMALL)
    backend.detach("a")
    backend.detach("never-attached")
    first, second = backend.sample(now=0)
    assert (first.memory_used_mb, first.util_pct, first.job_memory_mb) == (0.0, 0.0, {})
    assert (second.memory_used_mb, second.util_pct) == (100.0, 20.0)


def test_multi_gpu_job_loads_every_gpu_it_uses():
    backend = VirtualBackend("V100x3")
    backend.attach("dp", [0, 2], CNN)
    assert [s.memory_used_mb for s in backend.sample(now=0)] == [1228.0, 0.0, 1228.0]


def test_interference_scales_utilisation_down_for_co_runners_only():
    model = FixedInterference(1.6)
    backend = VirtualBackend("V100x2", interference=model)
    backend.attach("a", 0, CNN, SharingMode.MPS, mps_percentage=None)
    backend.attach("b", 0, CNN, SharingMode.MPS)
    backend.attach("c", 1, CNN)
    first, second = backend.sample(now=0)
    # two 70 % jobs that each run 1.6x slower drive 2 * 70 / 1.6 = 87.5 %
    assert first.util_pct == pytest.approx(87.5)
    assert second.util_pct == 70.0  # alone: the model is not asked
    assert backend.slowdown("a") == 1.6 and backend.slowdown("c") == 1.0
    assert ("a", ("b",), "V100", SharingMode.MPS) in model.calls
    backend.set_paused("b", True)  # a paused job is nobody's co-runner
    assert backend.sample(now=0)[0].util_pct == 70.0
    assert backend.slowdown("a") == 1.0


def test_time_slicing_shares_time_and_adds_interference_on_top():
    backend = VirtualBackend("V100", interference=FixedInterference(1.25))
    backend.attach("a", 0, SMALL, SharingMode.TIME_SLICING)
    backend.attach("b", 0, SMALL, SharingMode.TIME_SLICING)
    # the model's 1.25 is the part on top of the time share: 20/1.25 + 20/1.25
    assert backend.sample(now=0)[0].util_pct == pytest.approx(32.0)
    assert backend.slowdown("a") == pytest.approx(2 * 1.25)
    plain = VirtualBackend("V100")
    plain.attach("a", 0, SMALL, SharingMode.TIME_SLICING)
    plain.attach("b", 0, SMALL, SharingMode.TIME_SLICING)
    assert plain.slowdown("a") == pytest.approx(2.0)  # time share without any model


def test_infeasible_co_location_drives_no_utilisation():
    backend = VirtualBackend("V100", interference=FixedInterference(float("inf")))
    backend.attach("a", 0, SMALL, SharingMode.MPS)
    backend.attach("b", 0, SMALL, SharingMode.MPS)
    assert backend.sample(now=0)[0].util_pct == 0.0


def test_mps_percentage_caps_a_jobs_share():
    backend = VirtualBackend("V100")
    backend.attach("a", 0, CNN, SharingMode.MPS, mps_percentage=30)
    assert backend.sample(now=0)[0].util_pct == 30.0


def test_mig_jobs_get_instances_and_a_slice_share():
    backend = VirtualBackend("A30")
    job = backend.attach("m", 0, CNN, SharingMode.MIG, mig_profile="2g.12gb", pid=9)
    assert job.mig_uuid is not None and job.mig_uuid.startswith("MIG-virtual-")
    (device,) = backend.devices()
    assert device.mig_enabled
    assert [(m.uuid, m.profile, m.memory_total_mb) for m in device.mig_devices] == [
        (job.mig_uuid, "2g.12gb", 12288.0)
    ]
    sample = backend.sample(now=0)[0]
    assert sample.util_pct == pytest.approx(35.0)  # 70 % of 2 slices out of 4
    assert sample.mig_memory_used_mb == {job.mig_uuid: 1228.0}
    with pytest.raises(GpuBackendError, match="no MIG profile '9g.99gb'"):
        backend.attach("x", 0, CNN, SharingMode.MIG, mig_profile="9g.99gb")
    with pytest.raises(GpuBackendError, match="V100 has no MIG profile"):
        VirtualBackend("V100").attach("x", 0, CNN, SharingMode.MIG, mig_profile="1g.5gb")


def test_unknown_jobs_and_gpus_are_errors():
    backend = VirtualBackend("V100")
    with pytest.raises(GpuBackendError, match="no virtual GPU 3"):
        backend.attach("a", 3, CNN)
    with pytest.raises(GpuBackendError, match="not attached"):
        backend.set_progress("ghost", 0.5)


def test_readings_are_deterministic():
    def run() -> list:
        backend = VirtualBackend("V100x2", interference=FixedInterference(1.3))
        backend.attach("a", 0, LAMMPS, "time_slicing", 0.0)
        backend.attach("b", 0, CNN, "time_slicing", 0.0)
        backend.set_progress("a", 0.6)
        return backend.sample(now=5.0)

    assert run() == run()
