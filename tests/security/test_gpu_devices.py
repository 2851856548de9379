"""A job cannot open the device nodes of GPUs it was not given (``workers.isolation.GpuDevices``).

The real agent (root, owner mode, real accounts) runs jobs on two virtual GPUs whose "device
nodes" are regular files ``nvidia0`` and ``nvidia1`` in a directory (``--gpu-device-dir``),
readable by every account, as ``/dev/nvidia*`` are on a usual driver install. Each job process
gets a real private mount namespace; the tests read what the job could open. The directory is
made a *shared* mount first (as ``/`` is under systemd), so a hiding mount that propagated back
to the node would show in this process's ``/proc/self/mountinfo``. Each test fails if the hiding
is removed (the job reads the other GPU's file) or leaks (the node's view changes).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from portal.core.agent_sync import InProcessTransport
from portal.core.models import Gpu, Job, Node, Placement, PlacementPart
from tests.nodes import catalogue_node
from tests.security.conftest import ACCOUNTS, refused_start
from workers.agent import NodeAgent, gpu_devices_for, kill_marked_processes
from workers.gpu.virtual_backend import VirtualBackend
from workers.isolation import OWNER, Account, GpuDevices, JobLaunch, JobUsers

NODE = "iso-gpu-1"
ROOT = Path(__file__).resolve().parents[2]
CONTENT = {0: "gpu zero\n", 1: "gpu one\n"}


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` in this process's mount namespace."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point == str(path) or point.startswith(f"{path}/"):
            points.append(point)
    return points


@pytest.fixture
def device_dir(shared_dir) -> Iterator[Path]:
    """``nvidia0`` and ``nvidia1`` (0644, with content) in a directory that is a shared mount
    of its own."""
    path = shared_dir / "dev"
    path.mkdir(mode=0o755)
    for index, text in CONTENT.items():
        node = path / f"nvidia{index}"
        node.write_text(text)
        node.chmod(0o644)
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
        subprocess.run(["mount", "--make-shared", str(path)], check=True)
        assert _mounts_under(path) == [str(path)]
        yield path
    finally:
        while _mounts_under(path):
            subprocess.run(["umount", "--lazy", str(path)], check=False)


def _host_view_unchanged(device_dir: Path) -> None:
    assert _mounts_under(device_dir) == [str(device_dir)], "a job's mount leaked to the node"
    for index, text in CONTENT.items():
        assert (device_dir / f"nvidia{index}").read_text() == text


@pytest.fixture
def node(db) -> Node:
    return catalogue_node(NODE, "A30", 2, "GPU-iso", cores=8, memory_mb=16384)


@pytest.fixture
def agent(node, accounts, shared_dir, device_dir) -> Iterator[NodeAgent]:
    agent = NodeAgent(
        NODE,
        VirtualBackend("A30x2", node=NODE),
        InProcessTransport(),
        cores=8,
        memory_mb=16384,
        data_dir=shared_dir,
        sample_every_s=0.0,
        job_users=JobUsers(OWNER, user_map=dict(ACCOUNTS), fallback="none"),
        gpu_device_dir=device_dir,
    )
    yield agent
    agent.shutdown(kill_jobs=True)
    kill_marked_processes(agent.marker)


def _job(owner, node: Node, command: str, gpus: tuple[int, ...], *, ranks: bool = False) -> Job:
    """A SCHEDULED job with its first attempt on ``gpus`` of ``node``; ``ranks``: an elastic
    job, one process (rank) per GPU."""
    job = Job.objects.create(
        owner=owner,
        name="t",
        command=command,
        gpus=len(gpus),
        state="SCHEDULED",
        elastic_min_workers=1 if ranks else None,
        elastic_max_workers=len(gpus) if ranks else None,
    )
    placement = Placement.objects.create(
        job=job, attempt=1, node=node, sharing_mode="exclusive", policy="test", cpus=1
    )
    placement.gpus.set(Gpu.objects.filter(node=node, index__in=gpus))
    PlacementPart.objects.create(
        placement=placement, node=node, node_rank=0, gpu_indices=list(gpus), cpus=1
    )
    return job


def _read_both(device_dir: Path) -> str:
    """A command printing, per GPU file, what the job's process got: its text or the error."""
    return "; ".join(
        f'echo "rank=${{LOCAL_RANK:-none}} uid=$(id -u) gpu{i}: $(cat {device_dir}/nvidia{i} 2>&1)"'
        for i in CONTENT
    )


def _until_ended(agent: NodeAgent, job: Job, timeout: float = 30.0) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        agent.step()
        job.refresh_from_db()
        if job.state in ("COMPLETED", "FAILED"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job.pk} still {job.state}")


def _seen(agent: NodeAgent, job: Job) -> dict[tuple[str, int], str]:
    """(rank, GPU) -> what that process read from the GPU's file, from the job's log."""
    seen = {}
    for line in agent.log_path(job.pk).read_text().splitlines():
        match = re.fullmatch(r"rank=(\S+) uid=(\d+) gpu(\d): (.*)", line)
        if match:
            assert int(match[2]) != 0  # the job ran as its owner's account, not root
            seen[(match[1], int(match[3]))] = match[4]
    return seen


def _denied(text: str) -> bool:
    return text.endswith("Permission denied")


def test_a_job_opens_its_own_gpu_only(alice, agent, node, device_dir, accounts):
    agent.start()
    assert agent.gpu_devices is not None and agent.gpu_devices.constrained
    job = _until_ended(agent, _job(alice, node, _read_both(device_dir), (0,)))
    seen = _seen(agent, job)
    assert job.state == "COMPLETED", agent.log_path(job.pk).read_text()
    assert seen[("none", 0)] == CONTENT[0].strip()
    assert _denied(seen[("none", 1)]), seen
    _host_view_unchanged(device_dir)


def test_each_rank_of_a_process_per_gpu_job_opens_its_own_gpu_only(alice, agent, node, device_dir):
    job = _until_ended(agent, _job(alice, node, _read_both(device_dir), (0, 1), ranks=True))
    seen = _seen(agent, job)
    assert job.state == "COMPLETED", agent.log_path(job.pk).read_text()
    assert seen[("0", 0)] == CONTENT[0].strip() and _denied(seen[("0", 1)]), seen
    assert seen[("1", 1)] == CONTENT[1].strip() and _denied(seen[("1", 0)]), seen
    _host_view_unchanged(device_dir)


def test_a_cpu_job_opens_no_gpu(alice, agent, node, device_dir):
    job = _until_ended(agent, _job(alice, node, _read_both(device_dir), ()))
    seen = _seen(agent, job)
    assert _denied(seen[("none", 0)]) and _denied(seen[("none", 1)]), seen
    _host_view_unchanged(device_dir)


def test_the_spec_names_the_nodes_each_process_hides(alice, agent, node, device_dir):
    _job(alice, node, "sleep 30", (0, 1), ranks=True)
    agent.step()
    (attempt,) = list(agent.attempts_dir.iterdir())
    devices = json.loads((attempt / "spec.json").read_text())["isolation"]["gpu_devices"]
    assert devices["hide"] == [[str(device_dir / "nvidia1")], [str(device_dir / "nvidia0")]]
    mask = Path(devices["mask"])
    deadline = time.monotonic() + 15
    while not (attempt / "job.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the runner makes the mask before it starts the ranks
    assert mask.parent == attempt and mask.stat().st_mode & 0o7777 == 0
    assert mask.stat().st_uid == 0 and mask.stat().st_size == 0


def test_a_job_in_a_user_namespace_of_its_own_cannot_remove_the_hiding(
    alice, agent, node, device_dir
):
    """As root of a new user namespace the job may mount, but the mounts it inherited are
    locked: it can neither unmount the mask nor bind the directory without it."""
    other, peek = device_dir / "nvidia1", device_dir.parent / "peek"
    peek.mkdir(mode=0o777)
    peek.chmod(0o777)
    script = (
        f"umount {other} 2>/dev/null || echo umount refused; "
        f"mount --bind {device_dir} {peek} 2>/dev/null || echo bind refused; "
        f'echo "read: $(cat {other} {peek}/nvidia1 2>&1 | head -n 1)"'
    )
    userns = "unshare --user --map-root-user --mount"
    command = f"{userns} true || echo no user namespaces; {userns} sh -c '{script}'"
    job = _until_ended(agent, _job(alice, node, command, (0,)))
    log = agent.log_path(job.pk).read_text()
    if "no user namespaces" in log:
        pytest.skip("this kernel gives unprivileged accounts no user namespaces")
    assert "umount refused" in log and "bind refused" in log, log
    assert re.search(r"read: .*nvidia1: Permission denied", log), log
    assert CONTENT[1].strip() not in log
    _host_view_unchanged(device_dir)


def test_a_job_whose_devices_cannot_be_hidden_does_not_run(accounts, shared_dir, device_dir):
    """Fail closed: a node that should hide a GPU but cannot (here: a directory where the
    device node should be) does not start the job."""
    (device_dir / "nvidia2").mkdir()
    launch = JobLaunch(
        {
            "account": Account.lookup("cst-alice").to_dict(),
            "gpu_devices": {
                "mask": str(shared_dir / "mask"),
                "hide": [[str(device_dir / "nvidia2")]],
            },
        }
    )
    log_text = refused_start(launch, shared_dir)
    assert f"the job cannot start: [Errno 20] cannot hide {device_dir}/nvidia2" in log_text
    _host_view_unchanged(device_dir)


def _as(account: str, code: str) -> subprocess.CompletedProcess[str]:
    entry = Account.lookup(account)
    return subprocess.run(
        ["setpriv", f"--reuid={entry.uid}", f"--regid={entry.gid}", "--init-groups"]
        + [sys.executable, "-c", code],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_agent_that_cannot_make_mount_namespaces_says_so_and_why(accounts, device_dir):
    nodes = {0: str(device_dir / "nvidia0"), 1: str(device_dir / "nvidia1")}
    # Without CAP_SYS_ADMIN: not tried.
    described = GpuDevices.detect(nodes, sys_admin=False).describe()
    assert described.startswith("GPU devices: not constrained (the agent runs as root (uid 0)")
    assert "without CAP_SYS_ADMIN" in described
    # Tried anyway by an account the kernel refuses unshare(CLONE_NEWNS) to.
    code = (
        "from workers.isolation import GpuDevices\n"
        f"devices = GpuDevices.detect({nodes!r}, sys_admin=True)\n"
        "print(devices.constrained, devices.describe())\n"
    )
    result = _as("cst-mallory", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("False GPU devices: not constrained (cannot make a private")
    assert "unshare(CLONE_NEWNS): Operation not permitted" in result.stdout
    # No device nodes to hide: virtual GPUs without --gpu-device-dir.
    virtual = gpu_devices_for(VirtualBackend("A30x2", node="n"), "virtual", None)
    assert "virtual GPUs have no device nodes" in virtual.describe()
    assert virtual.for_job([(0,)], "/nonexistent") is None


def _start_line(cli: list[str], user: str | None, data_dir: Path) -> tuple[str, str]:
    """The agent's second start-up line (its isolation) and its stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSCHED_")}
    env["COSCHED_DATA_DIR"] = str(data_dir)
    env["PYTHONPATH"] = str(ROOT)
    prefix = []
    if user is not None:
        entry = Account.lookup(user)
        prefix = ["setpriv", f"--reuid={entry.uid}", f"--regid={entry.gid}", "--init-groups"]
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "HOME": "/"}
        env["COSCHED_DATA_DIR"] = str(data_dir)
    proc = subprocess.Popen(
        prefix + cli, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return lines[1], err


def test_the_agent_says_at_start_whether_gpu_devices_are_constrained(
    accounts, shared_dir, device_dir
):
    token = shared_dir / "node.token"
    token.write_text("cosn_x\n")
    cli = [sys.executable, "-m", "workers.agent", "--name", "n1", "--portal", "http://127.0.0.1:9"]
    cli += ["--token-file", str(token), "--gpus", "A30x2", "--gpu-device-dir", str(device_dir)]
    cli += ["--interval", "5"]
    # As root (owner mode): constrained, and the description says root jobs are not.
    token.chmod(0o600)
    line, _ = _start_line(cli + ["--fallback-account", "cst-mallory"], None, shared_dir / "root")
    assert "GPU devices: constrained (private mount namespace per job; a job running as " in line
    assert "root can undo it)" in line
    # As an ordinary account: not constrained, and why; its jobs still run (it starts).
    mallory = accounts["mallory"]
    data = shared_dir / "mallory"
    data.mkdir()
    os.chown(data, mallory.pw_uid, mallory.pw_gid)
    os.chown(token, mallory.pw_uid, mallory.pw_gid)
    line, _ = _start_line(cli + ["--run-jobs-as", "cst-mallory"], "cst-mallory", data)
    assert (
        f"GPU devices: not constrained (the agent runs as cst-mallory (uid {mallory.pw_uid}) "
        f"without CAP_SYS_ADMIN" in line
    ), line


@pytest.fixture
def spare_agent(node, shared_dir, device_dir) -> Iterator[NodeAgent]:
    """The agent above, running alice's jobs as an account of this test's own."""
    name = "cst-spare-alice"
    subprocess.run(["userdel", name], capture_output=True, check=False)
    subprocess.run(
        ["useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh", name],
        check=True,
        capture_output=True,
    )
    agent = NodeAgent(
        NODE,
        VirtualBackend("A30x2", node=NODE),
        InProcessTransport(),
        cores=8,
        memory_mb=16384,
        data_dir=shared_dir,
        sample_every_s=0.0,
        job_users=JobUsers(OWNER, user_map={"alice": name}, fallback="none"),
        gpu_device_dir=device_dir,
    )
    yield agent
    agent.shutdown(kill_jobs=True)
    kill_marked_processes(agent.marker)
    subprocess.run(["userdel", name], capture_output=True, check=False)


def test_the_scheduler_runs_a_cpu_job_on_a_gpu_nodes_spare_cores_with_every_gpu_hidden(
    alice, spare_agent, node, device_dir
):
    from portal.core.models import PolicySettings

    agent = spare_agent
    from portal.core.scheduling import build_snapshot, run_cycle
    from portal.core.services import job_submit

    # No CPU node in this cluster: only the GPU node's spare cores can take a CPU job.
    PolicySettings.objects.create(name="t", policy="binpack", params={}, active=True)
    cpu_job, _ = job_submit(alice, name="cpu", command=_read_both(device_dir), gpus=0, cpus=3)
    too_big, _ = job_submit(alice, name="big", command="true", gpus=0, cpus=4)
    result = run_cycle()
    assert result.placed == [cpu_job.pk]
    placement = Placement.objects.get(job=cpu_job)
    assert placement.node == node and not placement.gpus.exists()
    # 8 cores, 3 given to the CPU job, one kept for each of the 2 idle GPUs: 3 spare
    too_big.refresh_from_db()
    assert "needs 4 free cores: most free is 3 on iso-gpu-1" in too_big.waiting_reason
    (state,) = build_snapshot().state.nodes
    assert state.free_cores == 5  # the CPU job's cores count against the node
    job = _until_ended(agent, cpu_job)
    seen = _seen(agent, job)
    assert job.state == "COMPLETED", agent.log_path(job.pk).read_text()
    assert _denied(seen[("none", 0)]) and _denied(seen[("none", 1)]), seen
    _host_view_unchanged(device_dir)
    # with the setting off, a CPU job waits for a CPU node
    PolicySettings.objects.filter(active=True).update(params={"cpu_jobs_on_gpu_nodes": False})
    run_cycle()
    too_big.refresh_from_db()
    assert too_big.state == "PENDING" and "no CPU node is up" in too_big.waiting_reason
