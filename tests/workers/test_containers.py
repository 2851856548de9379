"""The container commands (workers.containers): pure argv and text, no runtime needed."""

from __future__ import annotations

import pytest

from workers import containers
from workers.containers import (
    apptainer_exec_argv,
    cdi_gpus,
    container_env,
    container_name,
    detect_runtimes,
    gpu_devices,
    image_allowed,
    podman_control_argv,
    podman_run_argv,
)


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_podman_run_holds_the_job_to_its_account_cores_memory_gpus_and_directory():
    argv = podman_run_argv(
        "localhost/train:1",
        "python train.py --epochs 3",
        ["COSCHED_JOB_ID", "CUDA_VISIBLE_DEVICES", "HF_HOME"],
        name="cosched-ab-7-1",
        uid=1234,
        gid=1300,
        workdir="/var/lib/cosched/work/job-7",
        mounts=["/var/lib/cosched/checkpoints/job-7"],
        cpus=4,
        memory_mb=8192,
        devices=["nvidia.com/gpu=1", "nvidia.com/gpu=3"],
    )
    assert argv[:3] == ["podman", "run", "--rm"]
    assert _pairs(argv, "--name") == ["cosched-ab-7-1"]
    assert _pairs(argv, "--user") == ["1234:1300"]
    assert _pairs(argv, "--network") == ["none"]
    assert _pairs(argv, "--cpus") == ["4"]
    assert _pairs(argv, "--memory") == ["8192m"] == _pairs(argv, "--memory-swap")
    assert _pairs(argv, "--device") == ["nvidia.com/gpu=1", "nvidia.com/gpu=3"]
    assert _pairs(argv, "-v") == [
        "/var/lib/cosched/work/job-7:/var/lib/cosched/work/job-7",
        "/var/lib/cosched/checkpoints/job-7:/var/lib/cosched/checkpoints/job-7",
    ]
    assert _pairs(argv, "-w") == ["/var/lib/cosched/work/job-7"]
    assert _pairs(argv, "--pull") == ["never"]  # a node never fetches an image on its own
    # Names only: the values (a job token) come from podman's environment, not the argv.
    assert _pairs(argv, "-e") == ["COSCHED_JOB_ID", "CUDA_VISIBLE_DEVICES", "HF_HOME"]
    assert argv[-4:] == ["localhost/train:1", "/bin/sh", "-c", "python train.py --epochs 3"]
    assert "--init" not in argv and "--ipc" not in argv


def test_podman_run_without_limits_or_command_and_with_mps_and_a_network():
    argv = podman_run_argv(
        "img",
        "  ",
        [],
        name="n",
        uid=0,
        gid=0,
        workdir="/w",
        network="host",
        ipc_host=True,
        init=True,
    )
    assert argv[-1] == "img"  # the image's entry point
    assert "--cpus" not in argv and "--memory" not in argv and "--device" not in argv
    assert _pairs(argv, "--network") == ["host"] and _pairs(argv, "--ipc") == ["host"]
    assert "--init" in argv
    for bad in (" ", "--privileged", "-v/:/host", "img name", "img\n"):
        with pytest.raises(ValueError):  # never an option of podman's
            podman_run_argv(bad, "x", [], name="n", uid=0, gid=0, workdir="/w")
    assert containers.valid_image("nvcr.io/nvidia/pytorch:24.05-py3")
    assert containers.valid_image("python@sha256:0123abcd")
    assert containers.valid_image("/opt/images/train.sif")


def test_control_commands():
    assert podman_control_argv("stop", "c", grace_s=2.2) == ["podman", "stop", "--time", "3", "c"]
    assert podman_control_argv("stop", "c") == ["podman", "stop", "--time", "10", "c"]
    assert podman_control_argv("pause", "c") == ["podman", "pause", "c"]
    assert podman_control_argv("rm", "c") == ["podman", "rm", "--force", "--ignore", "c"]
    with pytest.raises(ValueError):
        podman_control_argv("exec", "c")


def test_gpu_devices_only_with_a_cdi_spec():
    assert gpu_devices([0, 2], cdi=True) == ["nvidia.com/gpu=0", "nvidia.com/gpu=2"]
    assert gpu_devices([1], mig_uuid="MIG-abc", cdi=True) == ["nvidia.com/gpu=MIG-abc"]
    assert gpu_devices([0, 2], cdi=False) == []
    assert gpu_devices([], cdi=True) == []


def test_container_env_keeps_the_jobs_variables_only():
    base = {"PATH": "/usr/bin", "HOME": "/root", "EDITOR": "vi", "LANG": "C.UTF-8"}
    env = {
        **base,
        "PATH": "/venv/bin:/usr/bin",
        "LD_PRELOAD": "x.so",
        "COSCHED_JOB_ID": "7",
        "CUDA_VISIBLE_DEVICES": "2,3",
        "NVIDIA_VISIBLE_DEVICES": "2,3",
        "HF_HOME": "/data/hf",
    }
    inner = container_env(env, base, workdir="/w", user="alice")
    assert inner == {
        "LANG": "C.UTF-8",
        "COSCHED_JOB_ID": "7",
        "CUDA_VISIBLE_DEVICES": "2,3",  # no CDI: the placement's indices
        "NVIDIA_VISIBLE_DEVICES": "2,3",
        "HF_HOME": "/data/hf",
        "HOME": "/w",
        "USER": "alice",
        "LOGNAME": "alice",
    }
    with_cdi = container_env(env, base, gpus=2, cdi=True)
    assert with_cdi["CUDA_VISIBLE_DEVICES"] == "0,1"  # only its GPUs, numbered from 0
    assert "NVIDIA_VISIBLE_DEVICES" not in with_cdi
    mig = container_env({**env, "CUDA_VISIBLE_DEVICES": "MIG-x"}, base, gpus=1, cdi=True)
    assert mig["CUDA_VISIBLE_DEVICES"] == "MIG-x"


def test_runtimes_detected_or_set():
    assert detect_runtimes(None, which=lambda n: "/usr/bin/podman" if n == "podman" else None) == (
        "podman",
    )
    assert detect_runtimes(None, which=lambda n: None) == ()
    assert detect_runtimes("apptainer, podman", which=lambda n: None) == ("podman", "apptainer")
    assert detect_runtimes("none", which=lambda n: "/x") == ()
    with pytest.raises(ValueError, match="docker"):
        detect_runtimes("docker")


def test_cdi_spec_detection(tmp_path):
    assert not cdi_gpus([str(tmp_path), str(tmp_path / "missing")])
    (tmp_path / "other.yaml").write_text("kind: vendor.com/fpga\n")
    assert not cdi_gpus([str(tmp_path)])
    (tmp_path / "nvidia.yaml").write_text('cdiVersion: 0.5.0\nkind: "nvidia.com/gpu"\n')
    assert cdi_gpus([str(tmp_path)])


def test_image_allow_list():
    assert image_allowed("anything:1", [])
    patterns = ["docker.io/library/*", "localhost/*"]
    assert image_allowed("localhost/cosched-test:1", patterns)
    assert image_allowed("docker.io/library/python:3.12", patterns)
    assert not image_allowed("docker.io/evil/python:3.12", patterns)
    assert not image_allowed("LOCALHOST/x", patterns)


def test_names_conf_and_apptainer():
    assert container_name("ab/c", 7, 2) == "cosched-ab_c-7-2"
    assert container_name("ab", 7, 2, rank=1) == "cosched-ab-7-2-r1"
    conf = containers.containers_conf()
    assert "default_ulimits = []" in conf and 'runtime = "runc"' in conf
    argv = apptainer_exec_argv("img.sif", "run", workdir="/w", nvidia=True)
    assert argv[:2] == ["apptainer", "exec"] and "--nv" in argv
    assert argv[-4:] == ["img.sif", "/bin/sh", "-c", "run"]
    assert containers.apptainer_env({"A": "1"}) == {"APPTAINERENV_A": "1"}
