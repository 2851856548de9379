"""A sharing policy's placement, through the real launcher, into a real process's environment.

The chain a node agent runs: the policy's decision (mode, MPS percentage, MIG profile and
layout) -> the GPU backend (the ``virtual`` one: lays out MIG instances and hands out their
UUIDs) -> ``workers.launcher.build_env`` -> ``JobProcess`` -> what the job's process sees.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import replace

from scheduler.catalog import gpu_spec
from scheduler.domain import (
    ClusterState,
    GpuState,
    JobSpec,
    NodeKind,
    NodeState,
    Profile,
    SharingMode,
)
from scheduler.kernels import kernel_profiles, share_for_saturation
from scheduler.policies.registry import build_policy
from workers.gpu.virtual_backend import VirtualBackend
from workers.launcher import JobProcess, build_env

SHOW = (
    "import json, os; print(json.dumps({k: os.environ.get(k) for k in ("
    "'CUDA_VISIBLE_DEVICES', 'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE', 'CUDA_MPS_PIPE_DIRECTORY', "
    "'CUDA_MPS_LOG_DIRECTORY', 'COSCHED_SHARING_MODE', 'COSCHED_MIG_PROFILE')}))"
)


def run_and_read_env(env: dict[str, str], tmp_path) -> dict[str, str | None]:
    log = tmp_path / "job.log"
    proc = JobProcess.start([sys.executable, "-c", SHOW], env, log)
    assert proc.wait(30) == 0, log.read_text()
    return json.loads(log.read_text().strip().splitlines()[-1])


def test_mps_placement_process_sees_its_percentage_and_pipe_directory(tmp_path):
    ks = {k: replace(p, gpu_time_s={"V100": 0.05}) for k, p in kernel_profiles().items()}
    spec = replace(gpu_spec("V100"), sharing_modes=(SharingMode.EXCLUSIVE, SharingMode.MPS))
    node = NodeState("n1", NodeKind.GPU, 8, 8, gpus=(GpuState("n1", 0, spec),))
    jobs = (JobSpec(id="lm", profile=ks["LM"]), JobSpec(id="spmv", profile=ks["SPMV"]))
    plan = build_policy("kscheduler").schedule(ClusterState(0.0, (node,), jobs), random.Random(0))
    placement = next(d.placement for d in plan.decisions if d.placement.job_id == "spmv")
    assert placement.mode == SharingMode.MPS
    assert placement.mps_percentage == share_for_saturation(ks["SPMV"])

    pipe, logs = tmp_path / "mps-pipe", tmp_path / "mps-log"
    env = build_env(
        placement,
        {"PATH": "/usr/bin:/bin", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "99"},  # agent's own
        gpu_model="V100",
        mps_pipe_dir=pipe,
        mps_log_dir=logs,
    )
    seen = run_and_read_env(env, tmp_path)
    assert seen["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(placement.mps_percentage)
    assert seen["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert seen["CUDA_MPS_LOG_DIRECTORY"] == str(logs)
    assert seen["CUDA_VISIBLE_DEVICES"] == "0" and seen["COSCHED_SHARING_MODE"] == "mps"


def test_mig_placement_process_sees_its_instance_uuid(tmp_path):
    backend = VirtualBackend("A30", node="n1")
    backend.apply_mig_layout(0, ["2g.12gb", "1g.6gb", "1g.6gb"])
    layout = {m.uuid: m.profile for m in backend.devices()[0].mig_devices}
    spec = replace(gpu_spec("A30"), sharing_modes=(SharingMode.EXCLUSIVE, SharingMode.MIG))
    gpu = GpuState("n1", 0, spec, mig_layout=tuple(sorted(layout.values())))
    node = NodeState("n1", NodeKind.GPU, 8, 8, gpus=(gpu,))
    sensitive = Profile(
        "vgg", gpu_time_s={"A30": 60.0}, sensitivity=2.5, batch_size=5, image_size=56, cm_ratio=16.0
    )
    job = JobSpec(id="vgg", gpu_memory_mb=4000, profile=sensitive)
    (d,) = (
        build_policy("sharing_mode")
        .schedule(ClusterState(0.0, (node,), (job,)), random.Random(0))
        .decisions
    )
    placement = d.placement
    assert placement.mode == SharingMode.MIG and placement.mig_profile == "1g.6gb"
    assert placement.mig_layout is None  # a free 1g.6gb instance is there already

    vjob = backend.attach("vgg", 0, sensitive, SharingMode.MIG, mig_profile=placement.mig_profile)
    assert layout[vjob.mig_uuid] == "1g.6gb"
    env = build_env(placement, {"PATH": "/usr/bin:/bin"}, mig_uuid=vjob.mig_uuid, gpu_model="A30")
    seen = run_and_read_env(env, tmp_path)
    assert seen["CUDA_VISIBLE_DEVICES"] == vjob.mig_uuid
    assert seen["COSCHED_MIG_PROFILE"] == "1g.6gb" and seen["COSCHED_SHARING_MODE"] == "mig"
    assert seen["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] is None


def test_a_relayout_placement_is_applied_before_the_job_gets_its_instance(tmp_path):
    backend = VirtualBackend("A30", node="n1")
    spec = replace(gpu_spec("A30"), sharing_modes=(SharingMode.EXCLUSIVE, SharingMode.MIG))
    node = NodeState("n1", NodeKind.GPU, 8, 8, gpus=(GpuState("n1", 0, spec),))
    big = Profile("big", gpu_time_s={"A30": 60.0}, sensitivity=2.5, batch_size=5, image_size=56)
    job = JobSpec(id="big", gpu_memory_mb=10000, profile=big)
    (d,) = (
        build_policy("sharing_mode")
        .schedule(ClusterState(0.0, (node,), (job,)), random.Random(0))
        .decisions
    )
    assert d.placement.mig_layout == ("2g.12gb",)
    report = backend.apply_mig_layout(0, d.placement.mig_layout)
    assert report.applied and report.created == ("2g.12gb",)
    vjob = backend.attach("big", 0, big, SharingMode.MIG, mig_profile="2g.12gb")
    assert vjob.mig_uuid == report.instances[0].uuid
    env = build_env(d.placement, {"PATH": "/usr/bin:/bin"}, mig_uuid=vjob.mig_uuid)
    assert run_and_read_env(env, tmp_path)["CUDA_VISIBLE_DEVICES"] == vjob.mig_uuid
