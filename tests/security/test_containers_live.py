"""Container jobs on the production-like stack (issue 25, docs/containers.md): a job with a
``container_image`` submitted through the HTTP API, scheduled by the Celery workers, run by a
node agent started as a command (``python -m workers.agent --run-jobs-as owner``, as root) with
real Podman (``--runtime runc`` through the agent's containers.conf). Nothing is pulled: the
image is imported here from a root file system of a static busybox.

Inside the container the job writes what it sees: its uid (the owner's account), the GPU its
placement gave it (``CUDA_VISIBLE_DEVICES`` on this virtual node, no GPU device node), its CPU
quota and memory limit (cgroup), its network (loopback only) and its working directory (the
node's work directory of the job, mounted). A second job is cancelled while it runs: its
container is stopped and removed.
"""

from __future__ import annotations

import os
import pwd
import shutil
import struct
import subprocess
import tarfile
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import db_access, stack, stack_database, wait_for  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db

NODE = "ctr-live-gpu"
PORTAL_USER = "ctralice"
ACCOUNT = "cst-ctr-alice"  # unique to this module (other modules' accounts may come and go)
BUSYBOX_APPLETS = ("sh", "id", "cat", "echo", "ls", "sleep", "grep", "env", "pwd", "wc")


def _podman_or_skip() -> str:
    podman = shutil.which("podman")
    if podman and shutil.which("runc"):
        return podman
    reason = "podman and runc are missing: `make container-deps` installs them (docs/containers.md)"
    if os.environ.get("CI") == "true":  # make test installs them: never green without
        pytest.fail(f"CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def _static_busybox() -> Path:
    """A statically linked busybox (Debian's busybox-static): an ELF without PT_INTERP."""
    for candidate in ("/bin/busybox", "/usr/bin/busybox", shutil.which("busybox") or ""):
        if candidate and Path(candidate).is_file() and _is_static(Path(candidate)):
            return Path(candidate)
    reason = "no static busybox: `make container-deps` installs busybox-static"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def _is_static(path: Path) -> bool:
    data = path.read_bytes()[:65536]
    if data[:4] != b"\x7fELF" or data[4] != 2:  # 64-bit ELF only
        return False
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        (p_type,) = struct.unpack_from("<I", data, phoff + i * phentsize)
        if p_type == 3:  # PT_INTERP: needs a dynamic loader
            return False
    return True


def _conf(directory: Path) -> dict[str, str]:
    from workers.containers import containers_conf

    conf = directory / "containers.conf"
    conf.write_text(containers_conf())
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    """``localhost/cosched-test-busybox:<random>``, imported from a busybox tree made here."""
    podman = _podman_or_skip()
    busybox = _static_busybox()
    name = f"localhost/cosched-test-busybox:{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="cosched-img-") as tmp:
        root = Path(tmp) / "root"
        for d in ("bin", "etc", "tmp", "proc", "sys", "dev"):
            (root / d).mkdir(parents=True)
        shutil.copy2(busybox, root / "bin" / "busybox")
        for applet in BUSYBOX_APPLETS:
            (root / "bin" / applet).symlink_to("busybox")
        (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (root / "tmp").chmod(0o1777)
        archive = Path(tmp) / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(root, arcname=".")
        env = _conf(Path(tmp))
        subprocess.run(
            [podman, "import", str(archive), name], check=True, capture_output=True, env=env
        )
        yield name
        subprocess.run([podman, "rmi", "--force", name], capture_output=True, env=env)


@pytest.fixture(scope="module")
def account() -> Iterator[pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.fail("container jobs run as their owner's account: run these tests as root")
    subprocess.run(["userdel", ACCOUNT], capture_output=True, check=False)
    subprocess.run(
        ["useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh", ACCOUNT],
        check=True,
        capture_output=True,
    )
    try:
        yield pwd.getpwnam(ACCOUNT)
    finally:
        subprocess.run(["userdel", ACCOUNT], capture_output=True, check=False)


@pytest.fixture(scope="module")
def live(stack, db_access, account, image):  # noqa: F811 (the fixtures imported above)
    """The stack with one virtual GPU node (two A30) whose agent runs container jobs with
    Podman as their owners; an API token of the job's owner."""
    from django.contrib.auth import get_user_model

    from portal.core.models import Node, PolicySettings
    from portal.front.services import token_create
    from workers.agent import kill_marked_processes, marker_for

    user = get_user_model().objects.create_user(PORTAL_USER, "c@example.org", "ctr-pw-12345")
    token = token_create(user, name="live")[1]
    PolicySettings.objects.all().delete()
    PolicySettings.objects.create(name="ctr", policy="fifo", active=True)
    data = Path(tempfile.mkdtemp(prefix="cosched-ctr-", dir="/tmp"))
    data.chmod(0o755)
    users_map = data / "users"
    users_map.write_text(f"{PORTAL_USER} {ACCOUNT}\n")
    stack.start_agent(
        NODE,
        gpus="A30x2",
        cores="8",
        data_dir=str(data),
        run_jobs_as="owner",
        job_user_map=str(users_map),
        fallback_account="none",
        container_runtimes="podman",
    )
    wait_for(
        lambda: Node.objects.filter(name=NODE, status="up").exists(),
        60,
        what=f"the agent of {NODE} to register\n{stack.log_text(f'agent-{NODE}')}",
    )
    yield stack, token, data
    stack.stop(f"agent-{NODE}")
    kill_marked_processes(marker_for(data / "agent" / NODE))
    shutil.rmtree(data, ignore_errors=True)


def _job(job_id: int):
    from portal.core.models import Job

    return Job.objects.get(pk=job_id)


def _wait(job_id: int, states: set[str], timeout: float = 90):
    return wait_for(
        lambda: (j := _job(job_id)).state in states and j,
        timeout,
        what=f"job {job_id} to reach {sorted(states)} (now {_job(job_id).state})",
    )


def _containers(podman: str, job_id: int) -> list[str]:
    out = subprocess.run(
        [podman, "ps", "--all", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
        env=_conf(Path(tempfile.gettempdir())),
    ).stdout.split()
    return [n for n in out if n.endswith(f"-{job_id}-1")]


# What the job reports from inside its container, one "key=value" per line.
FACTS = (
    "echo uid=$(id -u) gid=$(id -g); "
    "echo cuda=$CUDA_VISIBLE_DEVICES gpus=$COSCHED_GPU_INDICES; "
    "echo devices=$(ls /dev | grep -c nvidia); "
    "echo memory=$(cat /sys/fs/cgroup/memory.max 2>/dev/null "
    "|| cat /sys/fs/cgroup/memory/memory.limit_in_bytes); "
    "echo cpu=$(cat /sys/fs/cgroup/cpu.max 2>/dev/null "
    "|| cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us); "
    "echo interfaces=$(grep -c : /proc/net/dev); "
    "echo pwd=$(pwd) home=$HOME; "
    "echo from-the-container > made-inside; "
    "env | grep -c DATABASE_URL; "
    "echo done"
)


def test_a_container_job_runs_through_the_stack_with_its_owner_gpu_cores_and_memory(
    live, account, image
):
    from portal.core.models import Node

    portal, token, data = live
    assert Node.objects.get(name=NODE).container_runtimes == ["podman"]
    code, body = portal.api(
        "POST",
        "/api/v1/jobs/",
        token,
        {
            "name": "ctr",
            "command": FACTS,
            "container_image": image,
            "gpus": 1,
            "cpus": 2,
            "memory_mb": 256,
        },
    )
    assert code == 201, body
    job_id = body["id"]
    done = _wait(job_id, {"COMPLETED", "FAILED"})
    log = (data / "logs" / f"job-{job_id}.log").read_text(errors="replace")
    assert done.state == "COMPLETED", f"{done.failure_reason}\n{log}"
    facts = {}
    for line in log.splitlines():
        for word in line.split():
            key, sep, value = word.partition("=")
            if sep:
                facts[key] = value
    placement = done.placements.get(attempt=1)
    (part,) = placement.parts.all()
    assert facts["uid"] == str(account.pw_uid) and facts["gid"] == str(account.pw_gid), log
    assert facts["cuda"] == ",".join(map(str, part.gpu_indices)) == facts["gpus"], log
    assert len(part.gpu_indices) == 1
    assert facts["devices"] == "0", log  # a virtual node: no GPU device node inside
    assert facts["memory"] == str(256 * 2**20), log
    assert facts["cpu"].split()[0] == "200000", log  # 2 cores of 100 ms periods
    assert facts["interfaces"] == "1", log  # /proc/net/dev: lo only (no network)
    workdir = data / "work" / f"job-{job_id}"
    assert facts["pwd"] == str(workdir) == facts["home"], log
    made = workdir / "made-inside"
    assert made.read_text() == "from-the-container\n"
    assert made.stat().st_uid == account.pw_uid
    assert "\n0\ndone" in log  # no DATABASE_URL inside
    assert _containers(shutil.which("podman") or "podman", job_id) == []  # removed


def test_cancelling_a_container_job_stops_and_removes_its_container(live, image):
    portal, token, data = live
    podman = shutil.which("podman") or "podman"
    code, body = portal.api(
        "POST",
        "/api/v1/jobs/",
        token,
        {
            "name": "ctr-long",
            "command": "trap 'echo got-term; exit 143' TERM; echo started; sleep 300 & wait",
            "container_image": image,
            "gpus": 1,
            "cpus": 1,
        },
    )
    assert code == 201, body
    job_id = body["id"]
    _wait(job_id, {"RUNNING"})
    log = data / "logs" / f"job-{job_id}.log"
    wait_for(lambda: "started" in log.read_text(errors="replace"), 30, what="the job's start")
    assert len(_containers(podman, job_id)) == 1
    code, body = portal.api("POST", f"/api/v1/jobs/{job_id}/cancel/", token)
    assert code in (200, 202), body
    ended = _wait(job_id, {"CANCELLED"}, timeout=60)
    assert ended.state == "CANCELLED"
    wait_for(lambda: _containers(podman, job_id) == [], 30, what="the container to go")
    assert "got-term" in log.read_text(errors="replace")
