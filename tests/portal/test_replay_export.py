"""The history export: a known set of finished jobs and nodes, written in the simulator's formats,
read back by the simulator's own readers (and its command line) with every field intact."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from portal.core.models import ApplicationProfile
from portal.replay.export import history_export, history_export_write
from scheduler.cluster_spec import load_cluster_spec
from scheduler.domain import NodeKind
from scheduler.traces import read_trace
from tests.portal.replay_helpers import T0, finished_job, make_nodes, make_profile

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def history(alice, bob):
    nodes = make_nodes()
    resnet = make_profile("ResNet", TitanXp=600.0, A30=400.0)
    resnet_v2 = make_profile("ResNet", version="2", TitanXp=500.0)
    lammps = ApplicationProfile.objects.create(
        name="LAMMPS", kind="hpc", status="approved", cpu_time_s=990.0
    )
    jobs = {
        "a": finished_job(
            alice,
            name="a",
            submitted_s=0,
            wait_s=5,
            run_s=620,
            node=nodes["titan"],
            profile=resnet,
            gpu_memory_mb=4000,
            priority=3,
        ),
        "b": finished_job(
            bob,
            name="b, with a comma",
            submitted_s=30,
            wait_s=0,
            run_s=510,
            node=nodes["titan"],
            profile=resnet_v2,
            gpus=2,
        ),
        # no profile: exported with its measured run on the model it ran on
        "c": finished_job(
            alice, name="c", submitted_s=60, wait_s=2, run_s=123.5, node=nodes["titan"]
        ),
        "d": finished_job(
            bob,
            name="d",
            submitted_s=90,
            wait_s=1,
            run_s=1000,
            node=nodes["cpu"],
            gpus=0,
            profile=lammps,
            cpus=4,
            kind="hpc",
        ),
        # left out: failed, cancelled, no profile and never started, outside the period
        "e": finished_job(alice, name="e", submitted_s=100, wait_s=1, run_s=5, state="FAILED"),
        "f": finished_job(alice, name="f", submitted_s=110, wait_s=0, run_s=0, state="CANCELLED"),
        "g": finished_job(alice, name="g", submitted_s=120, wait_s=0, run_s=0),
        "late": finished_job(
            alice,
            name="late",
            submitted_s=7200,
            wait_s=0,
            run_s=9,
            node=nodes["titan"],
            profile=resnet,
        ),
    }
    return nodes, jobs


def test_the_export_round_trips_through_the_simulator_readers(history, tmp_path):
    _nodes, jobs = history
    export = history_export(T0, T0 + timedelta(hours=1))
    paths = history_export_write(export, tmp_path)

    assert export.left_out == {
        "failed (not completed)": 1,
        "cancelled (not completed)": 1,
        "no profile and no measured run": 1,
    }
    read = read_trace(paths["trace"], profiles=paths["profiles"])
    by_id = {j.id: j for j in read}
    assert list(by_id) == [str(jobs[k].pk) for k in ("a", "b", "c", "d")]

    a, b, c, d = (by_id[str(jobs[k].pk)] for k in ("a", "b", "c", "d"))
    assert [j.arrival_s for j in (a, b, c, d)] == [0.0, 30.0, 60.0, 90.0]
    assert (a.owner, b.owner, c.owner, d.owner) == ("alice", "bob", "alice", "bob")
    assert a.name == "a" and b.name == "b, with a comma"
    assert (a.gpus, b.gpus, c.gpus, d.gpus) == (1, 2, 1, 0)
    assert a.gpu_memory_mb == 4000 and a.priority == 3 and b.gpu_memory_mb is None
    assert d.cpus == 4 and d.kind == "hpc"
    # profiles as the portal holds them; two versions of one name kept apart
    assert a.profile.name == "ResNet v1" and b.profile.name == "ResNet v2"
    assert dict(a.profile.gpu_time_s) == {"TitanXp": 600.0, "A30": 400.0}
    assert dict(b.profile.gpu_time_s) == {"TitanXp": 500.0}
    assert a.profile.gpu_memory_max_mb == 3000
    assert d.profile.cpu_time_s == 990.0
    # the measured profile of the job submitted without one
    assert c.profile.name == f"job-{jobs['c'].pk}"
    assert dict(c.profile.gpu_time_s) == {"TitanXp": pytest.approx(123.5)}

    cluster = load_cluster_spec(paths["cluster"])
    nodes = {n.name: n for n in cluster.nodes}
    assert set(nodes) == {"gpu-titan-0", "cpu-a-0"}
    assert nodes["gpu-titan-0"].gpu_model == "TitanXp" and nodes["gpu-titan-0"].gpu_count == 2
    assert nodes["gpu-titan-0"].cores == 16 and nodes["gpu-titan-0"].memory_mb == 65536
    assert nodes["cpu-a-0"].kind == NodeKind.CPU and nodes["cpu-a-0"].cores == 8
    titan = cluster.gpu_spec("TitanXp")
    assert titan.memory_mb == 12288 and titan.sm_count == 30
    assert {m.value for m in titan.sharing_modes} == {"exclusive", "time_slicing", "mps"}

    # what really happened, for the comparison's first row
    live = {r.job_id: r for r in export.live}
    assert live[str(jobs["a"].pk)].queue_s == 5 and live[str(jobs["a"].pk)].jct_s == 625
    assert (
        live[str(jobs["a"].pk)].solo_s == 600.0 and live[str(jobs["a"].pk)].gpu_model == "TitanXp"
    )
    assert live[str(jobs["d"].pk)].solo_s == 990.0


def test_the_simulator_command_line_replays_the_export(history, tmp_path):
    out = tmp_path / "export"
    call_command(
        "export_history",
        "--since",
        T0.isoformat(),
        "--until",
        (T0 + timedelta(hours=1)).isoformat(),
        "--out",
        str(out),
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduler.simulate",
            "--trace",
            str(out / "trace.csv"),
            "--profiles",
            str(out / "profiles.yaml"),
            "--cluster",
            str(out / "cluster.yaml"),
            "--policy",
            "fifo",
            "--policy",
            "binpack",
            "--quiet",
            "--out",
            str(tmp_path / "sim"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "4 jobs, 2 nodes: 2 GPUs (2 TitanXp), 1 CPU nodes" in result.stdout
    import pandas as pd

    summary = pd.read_csv(tmp_path / "sim" / "summary.csv")
    assert list(summary["policy"]) == ["fifo", "binpack"]
    assert list(summary["completed"]) == [4, 4]


def test_the_command_refuses_bad_periods(history, tmp_path):
    with pytest.raises(CommandError, match="--since"):
        call_command("export_history", "--since", "last tuesday", "--out", str(tmp_path))
    with pytest.raises(CommandError, match="after"):
        call_command(
            "export_history",
            "--since",
            "2026-03-02",
            "--until",
            "2026-03-01",
            "--out",
            str(tmp_path),
        )
    assert not list(tmp_path.iterdir())


def test_nodes_registered_after_the_period_are_not_in_its_cluster(history):
    from portal.core.models import Node

    Node.objects.create(name="later", kind="cpu", cores=2)  # created now, long after T0
    export = history_export(T0, T0 + timedelta(hours=1))
    assert [g["name"] for g in export.cluster["nodes"]] == ["cpu-a", "gpu-titan"]
