"""Seed 004 live (ALGORITHMS.md §1): the demo's job set on the demo's virtual cluster.

``load_demo`` makes what ``make demo`` runs: two virtual GPU nodes (2 Titan Xp, 2 A30), a CPU
node, the 25 jobs of the paper (13 CNN-MNIST, 5 BlackScholes, 5 Binomial, LAMMPS, GROMACS) as
emulated processes, each declaring Table 2's GPU memory, and ``placement_rate+exec_plan`` with
5 jobs per GPU. The embedded loop runs them (real subprocesses; the GPUs are the ``virtual``
backend's). Since the demo profiles have A30 times (issue 18), the four GPUs' 20 container
slots hold nearly the whole set, so the rate split rightly keeps the jobs on the GPUs (the
paper's testbed had fewer GPU slots; the CPU side of the demo is checked with its arrival stream
in tests/portal/test_demo_cluster.py, the split itself in the simulator's seed004 tests).
We check the ranking, and the memory plan: LAMMPS declares Table 2's 2,273 MB, and the plan
pauses it before its 8.3 GB step (plus the plan's margin) overflows a shared Titan Xp, with
the process really stopped (SIGSTOP) and continued, and the reason on the job's page.
"""

from __future__ import annotations

import threading
import time
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from portal.core.models import Job, JobEvent, Placement, PolicySettings
from tests.e2e.conftest import wait_for
from tests.embedded import embedded_loop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Profile times x 0.1: the CNNs run ~20 s on a GPU, LAMMPS ~8.5 s; the CPU jobs much longer.
SCALE = "0.1"


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def test_demo_seed004_set_ranks_by_rate_and_the_plan_pauses_lammps(settings, tmp_path, client):
    call_command("load_demo", "--emulate-scale", SCALE, stdout=StringIO())
    # The demo's policy with a wider safety margin: since a job takes an idle GPU before it
    # joins residents, LAMMPS shares its Titan Xp with two CNN-MNIST and two BlackScholes,
    # 0.4 GB short of an overflow at the default margin (128 MB); at 1 GB the plan must act.
    policy = PolicySettings.objects.get(active=True)
    policy.params = {**policy.params, "alpha_mb": 1024.0}
    policy.save()
    lammps = Job.objects.get(name="LAMMPS-1")
    # The LAMMPS process's state as a watcher thread sees it (every 20 ms): stopped by the
    # pause (T), then running again after the resume.
    seen: list[str] = []
    stop = threading.Event()

    with embedded_loop(settings, tmp_path / "logs") as agents:

        def watch() -> None:
            while not stop.is_set():
                for agent in agents:
                    pid = agent.job_pid(lammps.pk)
                    if pid and (not seen or seen[-1] != _proc_state(pid)):
                        seen.append(_proc_state(pid))
                time.sleep(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        wait_for(
            lambda: JobEvent.objects.filter(
                job=lammps, from_state="PAUSED", to_state="RUNNING"
            ).exists(),
            150,
            interval=0.5,
            what="LAMMPS to be paused and resumed by the plan",
        )
        wait_for(
            lambda: Job.objects.get(pk=lammps.pk).state in {"COMPLETED", "FAILED"},
            60,
            interval=0.5,
            what="LAMMPS to finish",
        )
        stop.set()
        watcher.join(5)

    # The ranking: CNNs first, on both GPU models (the A30s have estimated times now).
    sides: dict[str, set[str]] = {}
    for p in Placement.objects.select_related("job", "node"):
        sides.setdefault(p.job.name.rsplit("-", 1)[0], set()).add(p.node.name)
    assert sides["CNN-MNIST"] == {"gpu-titanxp-1", "gpu-a30-1"}, sides
    assert sides["LAMMPS"] == {"gpu-titanxp-1"}, sides
    explanation = Placement.objects.get(job__name="CNN-MNIST-1").explanation
    assert "rate " in explanation and "GPU capacity for" in explanation, explanation

    # The plan: LAMMPS paused before its 8.2 GB step, the process stopped, then continued.
    lammps.refresh_from_db()
    assert lammps.state == "COMPLETED", lammps.failure_reason
    pause = JobEvent.objects.filter(job=lammps, to_state="PAUSED").order_by("at").first()
    assert pause.actor == "scheduler"
    assert pause.message.startswith("placement_rate+exec_plan: paused ")
    assert "LAMMPS-1 step 4 needs 9.1 GB" in pause.message
    assert "of 12.0 GB predicted on gpu-titanxp-1/gpu" in pause.message
    assert "T" in seen, seen
    assert any(state not in ("T", "gone") for state in seen[seen.index("T") :]), seen

    # Nothing ran out of memory; every GPU job that ended, completed.
    assert not Job.objects.filter(state="FAILED").exists()

    # The job's page shows why it was paused.
    client.login(username="demo", password="demo-pass-123")
    page = client.get(f"/jobs/{lammps.pk}/").content.decode()
    assert "LAMMPS-1 step 4 needs 9.1 GB" in page and "PAUSED" in page
