"""Trace readers: Gavel, Cosched profile trace, Alibaba pods; errors name file, line, field."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from scheduler.domain import JobKind, JobSpec, MemoryStep, Profile
from scheduler.inputs import InputError
from scheduler.traces import (
    GAVEL_SOLO_CSV,
    GAVEL_TRACES_DIR,
    detect_trace_format,
    load_profiles,
    read_alibaba_pods,
    read_gavel_trace,
    read_profile_trace,
    read_trace,
    write_profile_trace,
)

# ../shared/data next to the project (main) or to the worktrees' parent (/work/wt/<name>).
SHARED = next(
    (
        p / "shared" / "data"
        for p in Path(__file__).resolve().parents
        if (p / "shared" / "data" / "alibaba_v2023").is_dir()
    ),
    Path(__file__).resolve().parents[3] / "shared" / "data",
)
ALIBABA = SHARED / "alibaba_v2023" / "openb_pod_list_default.csv"
GAVEL_HEADER = "job_id,job_type,arrival_time_s,total_steps,scale_factor\n"


def _solo_throughput(job_type: str, scale: int, gpu: str) -> float:
    with open(GAVEL_SOLO_CSV) as f:
        for row in csv.DictReader(f):
            if (row["job_type"], int(row["scale_factor"]), row["gpu_type"]) == (
                job_type,
                scale,
                gpu,
            ):
                return float(row["throughput"])
    raise AssertionError("not in table")


def test_gavel_run_time_is_steps_over_measured_throughput(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(GAVEL_HEADER + "7,ResNet-50 (batch size 64),12.5,5000,2\n3,A3C,0,1000,1\n")
    jobs = read_gavel_trace(path)
    assert [j.id for j in jobs] == ["3", "7"]  # sorted by arrival
    resnet = jobs[1]
    assert resnet.gpus == 2 and resnet.arrival_s == 12.5
    assert resnet.job_type == "ResNet-50 (batch size 64)"
    for model, gpu in (("K80", "k80"), ("P100", "p100"), ("V100", "v100")):
        expected = 5000 / _solo_throughput(resnet.job_type, 2, gpu)
        assert resnet.solo_time_s(model) == pytest.approx(expected)
    assert resnet.kind == JobKind.DL_TRAIN


def test_vendored_gavel_traces_read_completely():
    philly = read_trace(GAVEL_TRACES_DIR / "philly_ed69ec_951jobs.csv")
    assert len(philly) == 951
    assert all(set(j.profile.gpu_time_s) <= {"K80", "P100", "V100"} for j in philly)
    physical = read_trace(GAVEL_TRACES_DIR / "physical_96jobs.csv")
    assert {j.gpus for j in physical} == {1, 2, 4}


@pytest.mark.parametrize(
    ("row", "line", "field", "text"),
    [
        ("1,Quantum (batch size 1),0,10,1", 3, "job_type", "unknown job type"),
        ("1,A3C,zero,10,1", 3, "arrival_time_s", "expected a number"),
        ("1,A3C,0,10,3", 3, "scale_factor", "not measured at scale factor 3"),
        ("1,A3C,0,-5,1", 3, "total_steps", "must be > 0"),
        ("0,A3C,0,10,1", 3, "job_id", "used twice"),
    ],
)
def test_gavel_errors_name_file_line_and_field(tmp_path, row, line, field, text):
    path = tmp_path / "bad.csv"
    path.write_text(GAVEL_HEADER + "0,A3C,0,10,1\n" + row + "\n")
    with pytest.raises(InputError) as err:
        read_gavel_trace(path)
    assert (err.value.file, err.value.line, err.value.field) == (str(path), line, field)
    assert text in str(err.value) and f"bad.csv:{line}" in str(err.value)


def test_missing_column_is_named(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("job_id,job_type,arrival_time_s,scale_factor\n1,A3C,0,1\n")
    with pytest.raises(InputError, match="total_steps") as err:
        read_gavel_trace(path)
    assert err.value.line == 1


PROFILES_YAML = """\
profiles:
  - name: lammps
    kind: hpc
    cpu_time_s: 990
    gpu_time_s: {titan xp: 85, V100: 40}
    gpu_memory_max_mb: 2273
    memory_steps:
      - {start_fraction: 0.5, from_mb: 833, to_mb: 8317}
      - {start_fraction: 0, from_mb: 0, to_mb: 833}
    stall: {memory_dependency: 70, exec_dependency: 10}
  - name: cnn
    gpu_time_s: {TitanXp: 198}
"""


def test_profiles_yaml_and_profile_trace(tmp_path):
    (tmp_path / "p.yaml").write_text(PROFILES_YAML)
    profiles = load_profiles(tmp_path / "p.yaml")
    lammps = profiles["lammps"]
    assert lammps.gpu_time_s == {"TitanXp": 85.0, "V100": 40.0}  # names canonicalised
    assert lammps.memory_steps[0] == MemoryStep(0.0, 0.0, 833.0)  # sorted by start
    assert lammps.stall.memory_dependency == 70
    assert lammps.kind == JobKind.HPC
    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,arrival_s,profile,gpus,gpu_memory_mb,priority\nb,10,cnn,1,,2\na,5,lammps,1,3000,0\n"
    )
    jobs = read_profile_trace(trace, profiles)
    assert [j.id for j in jobs] == ["a", "b"]
    assert jobs[0].gpu_memory_mb == 3000 and jobs[1].gpu_memory_mb is None
    assert jobs[1].priority == 2 and jobs[1].name == "cnn"


@pytest.mark.parametrize(
    ("yaml_text", "line", "field"),
    [
        ("profiles:\n  - name: a\n    gpu_time_s: {V100: fast}\n", 3, "profiles[0].gpu_time_s"),
        ("profiles:\n  - name: a\n  - name: b\n    colour: red\n", 4, "profiles[1].colour"),
        ("profiles:\n  - name: a\n    kind: quantum\n", 3, "profiles[0].kind"),
        ("profiles: [\n", 2, None),
    ],
)
def test_profile_errors_name_line_and_field(tmp_path, yaml_text, line, field):
    path = tmp_path / "p.yaml"
    path.write_text(yaml_text)
    with pytest.raises(InputError) as err:
        load_profiles(path)
    assert err.value.line == line and err.value.field == field


def test_profile_trace_unknown_profile_names_line(tmp_path):
    (tmp_path / "p.yaml").write_text(PROFILES_YAML)
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,arrival_s,profile\na,0,cnn\nb,1,gromacs\n")
    with pytest.raises(InputError, match="unknown profile 'gromacs'") as err:
        read_profile_trace(trace, tmp_path / "p.yaml")
    assert (err.value.line, err.value.field) == (3, "profile")


def test_profile_trace_round_trip(tmp_path):
    prof = Profile(
        name="x",
        kind=JobKind.DL_TRAIN,
        gpu_time_s={"A100": 12.5},
        cpu_time_s=80.0,
        memory_steps=(MemoryStep(0.0, 10.0, 20.0),),
        cm_ratio=3.5,
    )
    jobs = [
        JobSpec(
            id="1", name="first", arrival_s=0.25, gpus=2, profile=prof, priority=1, job_type="t"
        ),
        JobSpec(id="2", arrival_s=3.0, profile=prof, gpu_memory_mb=99.0, cpus=4),
    ]
    write_profile_trace(jobs, tmp_path / "h.csv", tmp_path / "h.profiles.yaml")
    assert detect_trace_format(tmp_path / "h.csv") == "profile"
    back = read_trace(tmp_path / "h.csv")  # finds h.profiles.yaml next to it
    assert [
        (j.id, j.arrival_s, j.gpus, j.priority, j.cpus, j.gpu_memory_mb, j.job_type) for j in back
    ] == [
        (j.id, j.arrival_s, j.gpus, j.priority, j.cpus, j.gpu_memory_mb, j.job_type) for j in jobs
    ]
    assert back[0].profile == prof


@pytest.mark.skipif(not ALIBABA.exists(), reason="shared Alibaba trace not available")
def test_alibaba_pods_duration_and_fractional_gpus():
    jobs = read_alibaba_pods(ALIBABA, limit=300)
    assert len(jobs) == 300
    with open(ALIBABA) as f:
        rows = {r["name"]: r for r in csv.DictReader(f)}
    for j in jobs:
        row = rows[j.id]
        duration = float(row["deletion_time"]) - float(row["creation_time"])
        assert j.arrival_s == float(row["creation_time"])
        assert j.gpus == int(row["num_gpu"])
        if j.gpus:
            assert j.solo_time_s("V100") == pytest.approx(duration)
        else:
            assert j.solo_time_s(None) == pytest.approx(duration)
        milli = int(row["gpu_milli"])
        assert ("gpu_fraction" in j.params) == (j.gpus == 1 and milli < 1000)
    assert any("gpu_fraction" in j.params for j in jobs)


def test_unknown_format_is_reported(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="not a known trace format"):
        read_trace(path)
