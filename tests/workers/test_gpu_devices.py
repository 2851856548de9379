"""Which GPU device nodes each process of a job hides (``workers.agent.process_gpus``,
``gpu_device_nodes``, ``gpu_devices_for``; ``workers.isolation.devices_to_hide``, ``GpuDevices``,
``JobLaunch.hidden_for``). The mounts themselves: ``tests/security/test_gpu_devices.py``."""

from __future__ import annotations

import pytest

from tests.workers.fake_nvml import FakeGpu, FakeNvml
from workers.agent import gpu_device_nodes, gpu_devices_for, process_gpus
from workers.gpu.nvml_backend import NvmlBackend
from workers.gpu.virtual_backend import VirtualBackend
from workers.isolation import GpuDevices, IsolationError, JobLaunch, devices_to_hide
from workers.protocol import AttemptSpec, GangPart

NODES = {0: "/dev/nvidia0", 1: "/dev/nvidia1", 2: "/dev/nvidia2", 3: "/dev/nvidia3"}


def spec(gpus: tuple[int, ...], per_gpu: bool = False) -> AttemptSpec:
    return AttemptSpec(
        job_id=7,
        attempt=1,
        launch=True,
        paused=False,
        command="train",
        parts=(GangPart("n", 0, gpus),),
        process_per_gpu=per_gpu,
    )


def test_a_process_hides_every_gpu_but_its_own():
    assert devices_to_hide(NODES, [(1, 2)]) == [["/dev/nvidia0", "/dev/nvidia3"]]
    per_rank = devices_to_hide(NODES, [(0,), (3,)])
    assert per_rank == [
        ["/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3"],
        ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2"],
    ]
    assert devices_to_hide(NODES, [()]) == [sorted(NODES.values())]  # a CPU job: all
    assert devices_to_hide({}, [(0,)]) == [[]]


def test_each_rank_of_a_process_per_gpu_part_holds_its_own_gpu():
    assert process_gpus(spec((1, 3), per_gpu=True), {"CUDA_VISIBLE_DEVICES": "1,3"}) == [
        (1,),
        (3,),
    ]
    # One process for the part: all its GPUs; a CPU part: none.
    assert process_gpus(spec((1, 3)), {"CUDA_VISIBLE_DEVICES": "1,3"}) == [(1, 3)]
    assert process_gpus(spec(()), {"CUDA_VISIBLE_DEVICES": ""}) == [()]
    assert process_gpus(spec((), per_gpu=True), {}) == [()]
    # Ranks sharing one CUDA_VISIBLE_DEVICES entry (rank_envs) may each use every GPU of it.
    assert process_gpus(spec((0, 1), per_gpu=True), {"CUDA_VISIBLE_DEVICES": "MIG-x"}) == [
        (0, 1),
        (0, 1),
    ]


def test_device_nodes_follow_the_minor_number_else_the_index():
    fake = FakeNvml([FakeGpu(uuid="GPU-a", minor_number=4), FakeGpu(uuid="GPU-b")])
    devices = NvmlBackend(nvml=fake).devices()
    assert gpu_device_nodes(devices, "/dev") == {0: "/dev/nvidia4", 1: "/dev/nvidia1"}
    virtual = VirtualBackend("A30x2", node="n").devices()
    assert gpu_device_nodes(virtual, "/srv/fake") == {
        0: "/srv/fake/nvidia0",
        1: "/srv/fake/nvidia1",
    }


def test_which_node_hides_what_by_default():
    nvml = NvmlBackend(nvml=FakeNvml([FakeGpu(uuid="GPU-a", minor_number=0)]))
    devices = gpu_devices_for(nvml, "nvml", None, sys_admin=False)
    assert devices.nodes == {0: "/dev/nvidia0"} and not devices.constrained
    assert "without CAP_SYS_ADMIN" in devices.describe()
    virtual = gpu_devices_for(VirtualBackend("A30x2", node="n"), "virtual", None)
    assert virtual.nodes == {} and "--gpu-device-dir" in virtual.describe()
    stand_ins = gpu_devices_for(VirtualBackend("A30x2", node="n"), "virtual", "/d", sys_admin=False)
    assert stand_ins.nodes == {0: "/d/nvidia0", 1: "/d/nvidia1"}
    assert gpu_devices_for(None, "virtual", "/d").describe() == (
        "GPU devices: none to hide (a node without GPUs)"
    )


def test_an_unconstrained_node_hides_nothing_and_a_constrained_one_writes_every_process():
    assert GpuDevices("none", NODES, reason="x").for_job([(0,)], "/a/gpu-mask") is None
    entry = GpuDevices("namespace", {0: "/dev/nvidia0", 1: "/dev/nvidia1"}).for_job(
        [(0,), (1,)], "/a/gpu-mask"
    )
    assert entry == {"mask": "/a/gpu-mask", "hide": [["/dev/nvidia1"], ["/dev/nvidia0"]]}
    launch = JobLaunch({"gpu_devices": entry})
    assert (launch.hidden_for(0), launch.hidden_for(1)) == (["/dev/nvidia1"], ["/dev/nvidia0"])
    with pytest.raises(IsolationError, match="no GPU devices to hide given for process 2"):
        launch.hidden_for(2)  # a process the agent did not plan for does not start
    single = JobLaunch({"gpu_devices": {"mask": "/m", "hide": [["/dev/nvidia1"]]}})
    assert single.hidden_for(0) == single.hidden_for(5) == ["/dev/nvidia1"]
    assert JobLaunch(None).hidden_for(3) == []  # a spec from an agent that hides nothing
