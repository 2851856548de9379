"""``make gpu-check``: Cosched's own smoke test of a real GPU node (docs/gpu-check.md).

One run, under five minutes on one GPU: the embedded portal (SQLite, ``manage.py
run_embedded``) and a real ``--backend nvml`` node agent as root (jobs as their owner's unix
account, device hiding, cgroups where the host has them); jobs submitted through the REST API as
an ordinary user:

1. a job alone (a PyTorch bf16 matmul if torch imports, else a CUDA-free loop), its it/s;
2. a pair of them sharing the GPU by time-slicing, then under MPS (the MPS control daemon
   started as the job account, ``--no-mps`` skips it), each one's it/s over the time both ran;
3. a job past its time limit (ends FAILED, "time limit");
4. a CPU job on the GPU node, which must open no ``/dev/nvidia*``;
5. the portal's per-job GPU readings (``/api/v1/jobs/{id}/gpu-readings/``) beside
   ``nvidia-smi``'s at the same moments.

A table is printed at the end (and written to ``$OUT/gpu-check.txt`` when ``OUT`` is set); the
exit status is 0 when every check passed. Where no NVIDIA GPU is found it prints why and exits 0.
``--backend virtual`` runs the same code path on a virtual GPU (no nvidia-smi, no MPS daemon,
CUDA-free jobs): the dry run ``make gpu-check-dry`` and the test suite use it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NODE = "gpu-check-1"
USER = "gpucheck"  # the portal user the jobs belong to
ACCOUNT = "cosched-gpuchk"  # its unix account (made and removed by the check, as root)

# The job every GPU check runs: a bf16 matmul loop for SECS seconds holding HOLD_MB of GPU
# memory (or, without torch, the same loop on the CPU). It prints the project's progress lines
# (``@cosched progress <fraction> steps=N``; fraction = steps / TOTAL) and one timing line a
# second, ``gpu-check t=<epoch> steps=<n>``, from which the check measures rates over overlaps.
JOB_SCRIPT = r"""
import os, sys, time
secs, total = float(sys.argv[1]), float(sys.argv[2])
hold_mb, size = int(sys.argv[3]), int(sys.argv[4])
try:
    import torch
    cuda = torch.cuda.is_available()
except Exception:
    cuda = False
if cuda:
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    hold = torch.empty(hold_mb * 2**20, dtype=torch.uint8, device="cuda")
    def step():
        for _ in range(4):
            c = a @ b
        torch.cuda.synchronize()
else:
    def step():
        s = 0
        for i in range(20000):
            s += i * i
print(f"gpu-check device={'cuda' if cuda else 'cpu'} pid={os.getpid()}", flush=True)
t0 = last = time.time()
n = 0
while True:
    step()
    n += 1
    now = time.time()
    if now - last >= 1.0:
        last = now
        print(f"gpu-check t={now:.3f} steps={n}", flush=True)
        print(f"@cosched progress {min(1.0, n / total):.5f} steps={n}", flush=True)
    if now - t0 >= secs:
        break
print(f"gpu-check t={now:.3f} steps={n}", flush=True)
print(f"gpu-check done it_per_s={n / (now - t0):.2f} steps={n}", flush=True)
"""

# A CPU job on the GPU node: try every /dev/nvidia* (and the GPU dir given) and say what opened:
# it must open no GPU device node (/dev/nvidia<N>).
CPU_SCRIPT = r"""
import glob, os, re, sys
opened, refused, control = [], [], []
paths = sorted(set(glob.glob("/dev/nvidia*") + glob.glob(os.path.join(sys.argv[1], "nvidia*"))))
for path in paths:
    try:
        with open(path, "rb"):
            # /dev/nvidia<N> is a GPU; nvidiactl, nvidia-uvm, ... are the driver's control nodes,
            # which stay visible by design (no GPU is usable without its own device node).
            (opened if re.fullmatch(r"nvidia\d+", os.path.basename(path)) else control).append(path)
    except OSError as exc:
        refused.append(f"{path}:{exc.errno}")
print("gpu-check cpu opened=" + ",".join(opened) + " refused=" + ",".join(refused)
      + " control=" + ",".join(control), flush=True)
print(f"gpu-check cpu cuda_visible={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}", flush=True)
sys.exit(1 if opened else 0)
"""


@dataclass
class Row:
    check: str
    ok: bool | None  # None: not applicable here
    detail: str


@dataclass
class Run:
    """One check run: its directory, processes, API client."""

    opts: argparse.Namespace
    work: Path
    url: str = ""
    token: str = ""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    made_account: bool = False
    mps_env: dict[str, str] | None = None

    # -- HTTP --------------------------------------------------------------------------------

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        req.add_header("Authorization", f"Token {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:500]!r}") from exc

    def submit(self, name: str, command: str, **fields: Any) -> int:
        body = {"name": name, "command": command, "gpus": 1, "cpus": 1, **fields}
        return int(self.api("POST", "/api/v1/jobs/", body)["id"])

    def job(self, job_id: int) -> dict[str, Any]:
        return self.api("GET", f"/api/v1/jobs/{job_id}/")

    def wait(self, job_ids: list[int], states: set[str], timeout: float) -> dict[int, str]:
        deadline = time.monotonic() + timeout
        got: dict[int, str] = {}
        while time.monotonic() < deadline:
            got = {j: self.job(j)["state"] for j in job_ids}
            if all(s in states for s in got.values()):
                return got
            time.sleep(0.5)
        return got

    def log(self, job_id: int) -> str:
        path = self.work / "logs" / f"job-{job_id}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        if not text:
            text = self.api("GET", f"/api/v1/jobs/{job_id}/log/").get("text") or ""
        return text


def _say(text: str) -> None:
    print(f"gpu-check: {text}", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def no_gpu_reason() -> str | None:
    """Why this machine cannot run the real check (None: an NVIDIA GPU is there)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no nvidia-smi on PATH (no NVIDIA driver)"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi -L failed: {exc}"
    if out.returncode != 0 or "GPU 0" not in out.stdout:
        return f"nvidia-smi -L lists no GPU ({(out.stderr or out.stdout).strip()[:200]})"
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as exc:
        return f"NVML does not start here: {exc}"
    return None


def _as(account: str) -> Any:
    """A preexec_fn running the child as ``account`` (None when that is this process)."""
    pw = pwd.getpwnam(account)
    if os.geteuid() != 0 or pw.pw_uid == os.geteuid():
        return None

    def switch() -> None:
        os.setgroups([])
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)

    return switch


def job_python(prefer: str | None, account: str) -> str:
    """The interpreter jobs run with (as ``account``): the one given, else the first that the
    account can run and that imports torch, else the first it can run (CUDA-free jobs)."""
    if prefer:
        return prefer
    seen: list[str] = []
    path = os.environ.get("PATH", "")
    # PATH's python3 first (without this venv's bin: e.g. /opt/torch/.venv/bin/python3 on a
    # GPU machine), then the system's, then this one.
    outside = os.pathsep.join(
        d for d in path.split(os.pathsep) if Path(d).resolve() != Path(sys.executable).parent
    )
    for cand in (
        shutil.which("python3", path=outside),
        "/usr/bin/python3",
        "/usr/local/bin/python3",
        sys.executable,
    ):
        if cand and cand not in seen and os.path.exists(cand):
            seen.append(cand)
    runnable = []
    for cand in seen:
        for code, found in (("import torch", "torch"), ("pass", "plain")):
            try:
                probe = subprocess.run(
                    [cand, "-c", code],
                    capture_output=True,
                    timeout=120,
                    preexec_fn=_as(account),
                    cwd="/",
                )
            except (OSError, subprocess.SubprocessError):
                break
            if probe.returncode == 0:
                if found == "torch":
                    return cand
                runnable.append(cand)
                break
    if not runnable:
        raise RuntimeError(f"no Python the job account {account} can run among {seen}")
    return runnable[0]


# -- setup ---------------------------------------------------------------------------------------


def _env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "REDIS_"))}
    env.update(
        COSCHED_DATA_DIR=str(work),
        DJANGO_SETTINGS_MODULE="portal.settings",
        COSCHED_SYNC_INTERVAL_S="1",
        COSCHED_CYCLE_EVERY_S="1",
        COSCHED_OBSERVATION_WINDOW_S="3",
        # The project first; a PYTHONPATH the caller set (wheels unpacked beside the machine's
        # own packages, as on a lent GPU machine) stays after it.
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    return env


def _django(work: Path) -> None:
    for key in [k for k in os.environ if k.startswith(("DATABASE_", "REDIS_"))]:
        del os.environ[key]  # the embedded default: SQLite in the work directory, no broker
    os.environ.update(_env(work))
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def make_account(run: Run) -> str:
    """The unix account jobs run as: ``ACCOUNT`` (made here, as root), else this process's."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.getuid()).pw_name
    try:
        pwd.getpwnam(ACCOUNT)
    except KeyError:
        subprocess.run(
            ["useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh", ACCOUNT],
            check=True,
            capture_output=True,
        )
        run.made_account = True
    return ACCOUNT


def setup_portal(run: Run, policy: str) -> str:
    """Migrate, make the user, its API token, the node token; returns the token file."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from portal.core.models import PolicySettings
    from portal.core.nodes import node_token_create
    from portal.front.services import token_create

    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user(USER)  # API token only: no password
    _, run.token = token_create(user, name="gpu-check")
    _, key = node_token_create(NODE)
    token_file = run.work / "node.token"
    token_file.write_text(key)
    token_file.chmod(0o600)
    set_policy(policy, {})
    assert PolicySettings.objects.filter(active=True).count() == 1
    return str(token_file)


def set_policy(policy: str, params: dict[str, Any]) -> None:
    from portal.core.models import PolicySettings

    PolicySettings.objects.update(active=False)
    PolicySettings.objects.update_or_create(
        name=f"gpu-check-{policy}-{'-'.join(f'{k}={v}' for k, v in sorted(params.items()))}"[:100],
        defaults={"policy": policy, "params": params, "active": True},
    )


def start(run: Run, cmd: list[str], name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    out = open(run.work / f"{name}.out", "wb")  # noqa: SIM115  (closed with the process)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    run.procs.append(proc)
    return proc


def wait_http(run: Run, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            run.api("GET", "/api/v1/me/")
            return
        except Exception:
            time.sleep(0.5)
    raise RuntimeError(f"the portal did not answer at {run.url} in {timeout:.0f} s")


def wait_node(agent: subprocess.Popen[bytes], timeout: float = 60.0) -> Any:
    from portal.core.models import Node

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent.poll() is not None:
            raise RuntimeError(f"the node agent exited ({agent.returncode})")
        node = Node.objects.filter(name=NODE).prefetch_related("gpus").first()
        if node is not None and node.status == "up" and (node.kind == "cpu" or node.gpus.exists()):
            return node
        time.sleep(0.5)
    raise RuntimeError(f"node {NODE} did not register in {timeout:.0f} s")


# -- measurements --------------------------------------------------------------------------------


def timings(text: str) -> list[tuple[float, int]]:
    return [(float(t), int(n)) for t, n in re.findall(r"gpu-check t=([\d.]+) steps=(\d+)", text)]


def own_rate(text: str) -> float | None:
    m = re.search(r"gpu-check done it_per_s=([\d.]+)", text)
    return float(m.group(1)) if m else None


def rate_between(points: list[tuple[float, int]], lo: float, hi: float) -> float | None:
    inside = [(t, n) for t, n in points if lo <= t <= hi]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def smi_apps() -> dict[int, float]:
    """pid -> used memory (MiB) of every compute process nvidia-smi lists."""
    out = subprocess.run(
        [
            "nvidia-smi",
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    apps = {}
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            with contextlib.suppress(ValueError):
                apps[int(parts[0])] = float(parts[1])
    return apps


def smi_util() -> float | None:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    with contextlib.suppress(ValueError):
        return float(out.stdout.strip().splitlines()[0])
    return None


def newest_reading(run: Run, job_id: int) -> dict[str, Any] | None:
    readings = run.api("GET", f"/api/v1/jobs/{job_id}/gpu-readings/")["readings"]
    return readings[-1] if readings else None


# -- the checks ----------------------------------------------------------------------------------


def job_command(run: Run, secs: float, total: float, hold_mb: int) -> str:
    script = run.work / "job.py"
    return f"{run.opts.python} {script} {secs} {total} {hold_mb} {run.opts.size}"


def check_solo(run: Run, real: bool) -> float | None:
    secs = run.opts.seconds
    job_id = run.submit(
        "solo", job_command(run, secs, 1e12, 2048), gpu_memory_mb=4096, time_limit=600
    )
    states = run.wait([job_id], {"RUNNING"}, 60)
    if states.get(job_id) != "RUNNING":
        run.rows.append(Row("solo job runs", False, f"job {job_id}: {states.get(job_id)}"))
        return None
    # readings beside nvidia-smi at the same moments, once the job holds its memory (its
    # first timing line) and the agent has sampled it
    deadline = time.monotonic() + 90
    while "gpu-check t=" not in run.log(job_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2.5)
    pairs = []
    for _ in range(4):
        portal = newest_reading(run, job_id)
        smi = smi_apps() if real else {}
        util = smi_util() if real else None
        pairs.append((portal, smi, util))
        time.sleep(max(1.5, secs / 8))
    run.wait([job_id], {"COMPLETED", "FAILED", "CANCELLED"}, secs + 60)
    text = run.log(job_id)
    rate = own_rate(text)
    state = run.job(job_id)["state"]
    device = re.search(r"gpu-check device=(\w+)", text)
    run.rows.append(
        Row(
            "solo job",
            state == "COMPLETED" and rate is not None,
            f"job {job_id} {state} on {device.group(1) if device else '?'}: "
            f"{rate if rate is not None else '?'} it/s",
        )
    )
    for i, (portal, smi, util) in enumerate(pairs, 1):
        mine = portal["memory_mb"] if portal else None
        theirs = sum(smi.values()) if smi else None
        if real:
            ok = (
                mine is not None
                and theirs is not None
                and abs(mine - theirs) <= max(64.0, 0.05 * theirs)
            )
        else:
            ok = mine is not None
        detail = (
            f"portal {mine if mine is not None else '—'} MB, util "
            f"{portal.get('util_pct') if portal else '—'} %; nvidia-smi "
            f"{theirs if theirs is not None else 'n/a'} MB, "
            f"util {util if util is not None else 'n/a'} %"
        )
        run.rows.append(Row(f"readings vs nvidia-smi #{i}", ok, detail))
    summary = run.api("GET", f"/api/v1/jobs/{job_id}/gpu-readings/")["summary"]
    observations = run.api("GET", f"/api/v1/jobs/{job_id}/observations/")["observations"]
    peak = summary[0]["memory_peak_mb"] if summary else None
    run.rows.append(
        Row(
            "per-job readings and observations in the API",
            bool(summary) and bool(observations),
            f"{summary[0]['n'] if summary else 0} readings, peak {peak} MB; "
            f"{len(observations)} observations",
        )
    )
    return rate


def check_pair(run: Run, mode: str, solo: float | None) -> None:
    secs = run.opts.seconds
    total = (solo or 1.0) * secs
    set_policy("binpack", {"share_mode": mode, "max_jobs_per_gpu": 2})
    ids = [
        run.submit(
            f"{mode}-{k}",
            job_command(run, secs, total, 1024),
            gpu_memory_mb=4096,
            sharing=mode,  # a job's GPUs are its own unless it says how it may share
            time_limit=600,
        )
        for k in ("a", "b")
    ]
    run.wait(ids, {"RUNNING", "COMPLETED", "FAILED"}, 60)
    done = run.wait(ids, {"COMPLETED", "FAILED", "CANCELLED"}, secs * 3 + 60)
    texts = {j: run.log(j) for j in ids}
    points = {j: timings(texts[j]) for j in ids}
    ok = all(s == "COMPLETED" for s in done.values()) and all(points.values())
    if not ok:
        run.rows.append(Row(f"pair under {mode}", False, f"states {done}"))
        return
    lo = max(p[0][0] for p in points.values())
    hi = min(p[-1][0] for p in points.values())
    rates = [rate_between(points[j], lo, hi) for j in ids]
    from portal.core.models import Placement

    modes = sorted({p.sharing_mode for p in Placement.objects.filter(job_id__in=ids)})
    shared = modes == [mode]
    if solo and all(r is not None for r in rates):
        detail = " + ".join(f"{r / solo:.3f}" for r in rates if r is not None)
        detail = f"{detail} of solo over {hi - lo:.0f} s together ({modes})"
    else:
        detail = f"rates {rates} over {hi - lo:.0f} s together ({modes})"
    run.rows.append(Row(f"pair under {mode}", shared and hi - lo > 2, detail))


def check_time_limit(run: Run) -> None:
    job_id = run.submit("limit", job_command(run, 120, 1e12, 256), time_limit=5)
    run.wait([job_id], {"COMPLETED", "FAILED", "CANCELLED"}, 90)
    body = run.job(job_id)
    ok = body["state"] == "FAILED" and "time limit" in (body.get("failure_reason") or "")
    run.rows.append(Row("time limit", ok, f"{body['state']}: {body.get('failure_reason', '')}"))


def check_cpu_job(run: Run, device_dir: str) -> None:
    script = run.work / "cpu.py"
    job_id = run.submit(
        "cpu-on-gpu-node", f"{run.opts.python} {script} {device_dir}", gpus=0, cpus=1
    )
    run.wait([job_id], {"COMPLETED", "FAILED", "CANCELLED"}, 90)
    from portal.core.models import Placement

    placement = Placement.objects.filter(job_id=job_id).select_related("node").first()
    text = run.log(job_id)
    opened = re.search(r"gpu-check cpu opened=(\S*) refused=(\S*)(?: control=(\S*))?", text)
    state = run.job(job_id)["state"]
    ok = (
        state == "COMPLETED"
        and opened is not None
        and opened.group(1) == ""
        and placement is not None
        and placement.node.name == NODE
    )
    refused = opened.group(2) if opened else "?"
    run.rows.append(
        Row(
            "CPU job on the GPU node opens no GPU",
            ok,
            f"{state} on {placement.node.name if placement else '?'}; GPUs opened: "
            f"{(opened.group(1) if opened else '?') or 'none'}; refused {refused or 'none'}; "
            f"control nodes open (by design): {(opened.group(3) if opened else '') or 'none'}",
        )
    )


def start_mps(run: Run, account: str) -> str | None:
    """Start the MPS control daemon as the job account (the agent's pipe and log dirs)."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        return "nvidia-cuda-mps-control not found"
    assert run.mps_env is not None
    for d in run.mps_env.values():
        Path(d).mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(d, user=account, group=pwd.getpwnam(account).pw_gid)
    env = {**os.environ, **run.mps_env}
    out = subprocess.run(
        [control, "-d"], env=env, preexec_fn=_as(account), capture_output=True, text=True
    )
    if out.returncode != 0:
        return f"nvidia-cuda-mps-control -d failed: {out.stderr.strip()[:200]}"
    return None


def stop_mps(run: Run) -> None:
    control = shutil.which("nvidia-cuda-mps-control")
    if control and run.mps_env:
        subprocess.run(
            [control],
            input="quit\n",
            env={**os.environ, **run.mps_env},
            text=True,
            capture_output=True,
            timeout=30,
        )


# -- main ----------------------------------------------------------------------------------------


def table(rows: list[Row], header: str) -> str:
    width = max(len(r.check) for r in rows) if rows else 10
    lines = [
        header,
        "",
        f"| {'check'.ljust(width)} | result | detail |",
        f"|{'-' * (width + 2)}|--------|--------|",
    ]
    for r in rows:
        mark = "n/a" if r.ok is None else ("pass" if r.ok else "FAIL")
        lines.append(f"| {r.check.ljust(width)} | {mark:<6} | {r.detail} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__)
    p.add_argument("--backend", choices=["nvml", "virtual"], default="nvml")
    p.add_argument("--seconds", type=float, default=20.0, help="each GPU job's run time (s)")
    p.add_argument("--size", type=int, default=8192, help="matmul size (torch jobs)")
    p.add_argument(
        "--python", default=None, help="interpreter for the jobs (default: one with torch)"
    )
    p.add_argument("--no-mps", action="store_true", help="skip the MPS pair")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--work", default=None, help="work directory (default: a new temporary one)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    real = opts.backend == "nvml"
    if real:
        why = no_gpu_reason()
        if why is not None:
            _say(f"skipped: {why}. (`--backend virtual` runs the same checks on a virtual GPU.)")
            return 0
    work = Path(opts.work or tempfile.mkdtemp(prefix="cosched-gpu-check-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o755)
    run = Run(opts, work)
    started = time.monotonic()
    code = 1
    try:
        code = _run(run, real)
    except Exception as exc:  # the table says where it stopped, and the logs say why
        run.rows.append(Row("run", False, f"stopped: {exc}"))
        for name in ("agent.out", "portal.out"):
            path = work / name
            if path.exists():
                _say(f"last lines of {name}:")
                print("\n".join(path.read_text(errors="replace").splitlines()[-15:]), flush=True)
    finally:
        for proc in reversed(run.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
        stop_mps(run)
        if run.made_account:
            subprocess.run(["userdel", ACCOUNT], capture_output=True, check=False)
        elapsed = time.monotonic() - started
        header = (
            f"gpu-check ({opts.backend}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{elapsed:.0f} s, jobs with {opts.python})"
        )
        text = table(run.rows, header)
        print(text, flush=True)
        if os.environ.get("OUT"):
            out = Path(os.environ["OUT"])
            out.mkdir(parents=True, exist_ok=True)
            (out / "gpu-check.txt").write_text(text + "\n")
            for name in ("portal.out", "agent.out"):
                if (work / name).exists():
                    shutil.copy(work / name, out / name)
        if not opts.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            _say(f"kept {work}")
    return code


def _run(run: Run, real: bool) -> int:
    opts = run.opts
    (run.work / "job.py").write_text(JOB_SCRIPT)
    (run.work / "cpu.py").write_text(CPU_SCRIPT)
    for name in ("job.py", "cpu.py"):
        (run.work / name).chmod(0o644)
    _django(run.work)
    account = make_account(run)
    opts.python = job_python(opts.python, account)
    _say(f"jobs run as {account} with {opts.python}")
    token_file = setup_portal(run, "fifo")
    env = _env(run.work)
    port = _free_port()
    run.url = f"http://127.0.0.1:{port}"
    _say(f"portal at {run.url}, data in {run.work}")
    start(
        run,
        [sys.executable, "manage.py", "run_embedded", f"127.0.0.1:{port}", "--interval", "1"],
        "portal",
        env,
    )
    wait_http(run)
    run.mps_env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(run.work / "mps" / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(run.work / "mps" / "log"),
    }
    user_map = run.work / "users.map"
    user_map.write_text(f"{USER} {account}\n")
    device_dir = "/dev"
    agent = [
        sys.executable,
        "-m",
        "workers.agent",
        "--name",
        NODE,
        "--portal",
        run.url,
        "--token-file",
        token_file,
        "--backend",
        opts.backend,
        "--data-dir",
        str(run.work),
        "--sample-every",
        "1",
        "--cores",
        str(max(4, min(os.cpu_count() or 4, 16))),
    ]
    if os.geteuid() == 0:
        agent += ["--run-jobs-as", "owner", "--job-user-map", str(user_map)]
        agent += ["--fallback-account", "none"]
    if not real:
        agent += ["--gpus", "A30x1"]
        device_dir = str(run.work / "dev")
        Path(device_dir).mkdir(exist_ok=True)
        (Path(device_dir) / "nvidia0").write_text("stand-in for GPU 0\n")
        (Path(device_dir) / "nvidia0").chmod(0o644)
        agent += ["--gpu-device-dir", device_dir]
    node = wait_node(start(run, agent, "agent", {**env, **run.mps_env}))
    gpus = ", ".join(f"{g.model or g.uuid} {g.memory_mb} MB" for g in node.gpus.order_by("index"))
    isolation = "; ".join(f"{a['what']}: {a['level']}" for a in node.isolation or [])
    run.rows.append(Row("agent registered", True, f"{node.name}: {gpus}; {isolation}"))
    solo = check_solo(run, real)
    check_pair(run, "time_slicing", solo)
    if opts.no_mps:
        run.rows.append(Row("pair under mps", None, "skipped (--no-mps)"))
    elif not real:
        run.rows.append(Row("pair under mps", None, "no MPS daemon on a virtual GPU"))
    else:
        why = start_mps(run, account)
        if why is None:
            check_pair(run, "mps", solo)
            stop_mps(run)
        else:
            run.rows.append(Row("pair under mps", False, why))
    set_policy("fifo", {})
    check_time_limit(run)
    check_cpu_job(run, device_dir)
    failed = [r for r in run.rows if r.ok is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
