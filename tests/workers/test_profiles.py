"""The profile JSON contract and memory at progress."""

from __future__ import annotations

import json

import pytest

from scheduler.domain import JobKind, MemoryStep, Profile, StallReasons
from workers.profiles import (
    PROFILE_ENV,
    ProfileFormatError,
    load_profile,
    memory_at,
    peak_memory,
    profile_from_json,
    profile_to_json,
    profiles_document,
    step_index_at,
    steps_from_json,
)

LAMMPS = Profile(
    name="lammps",
    kind=JobKind.HPC,
    cpu_time_s=990.0,
    gpu_time_s={"TitanXp": 85.0},
    gpu_memory_max_mb=2273.0,
    memory_steps=(MemoryStep(0.0, 0.0, 833.0), MemoryStep(0.5, 833.0, 1895.0)),
    stall=StallReasons(memory_dependency=40.0),
)


def test_round_trip():
    data = profile_to_json(LAMMPS)
    assert data["kind"] == "hpc" and data["memory_steps"][1] == {
        "start_fraction": 0.5,
        "from_mb": 833.0,
        "to_mb": 1895.0,
    }
    assert "gpu_util_pct" not in data
    assert profile_from_json(json.loads(json.dumps(data))) == LAMMPS


def test_steps_accept_triples_and_sort_them():
    steps = steps_from_json([[0.5, 10, 20], {"start_fraction": 0, "from_mb": 0, "to_mb": 10}])
    assert steps == (MemoryStep(0.0, 0.0, 10.0), MemoryStep(0.5, 10.0, 20.0))
    with pytest.raises(ProfileFormatError, match="bad memory step"):
        steps_from_json([[0.5, 10]])
    with pytest.raises(ProfileFormatError, match="0..1"):
        steps_from_json([[1.5, 10, 20]])


def test_unknown_keys_are_ignored_and_bad_kinds_rejected():
    assert profile_from_json({"name": "x", "future_field": 1}) == Profile(name="x")
    with pytest.raises(ProfileFormatError, match="unknown job kind"):
        profile_from_json({"name": "x", "kind": "quantum"})
    with pytest.raises(ProfileFormatError, match="name"):
        profile_from_json({"cpu_time_s": 1})


def test_load_from_file_env_and_named_documents(tmp_path):
    doc = profiles_document([LAMMPS, Profile(name="cnn", gpu_time_s={"V100": 198.0})])
    path = tmp_path / "profiles.json"
    path.write_text(doc)
    assert load_profile("lammps", path=path) == LAMMPS
    assert load_profile("cnn", env={PROFILE_ENV: doc}).gpu_time_s == {"V100": 198.0}
    single = json.dumps(profile_to_json(LAMMPS))
    assert load_profile(None, env={PROFILE_ENV: single}) == LAMMPS
    assert load_profile("lammps", env={PROFILE_ENV: f"[{single}]"}) == LAMMPS
    assert load_profile("lammps", env={}) is None
    with pytest.raises(ProfileFormatError, match=r"'gromacs' not in .*found: cnn, lammps"):
        load_profile("gromacs", path=path)
    with pytest.raises(ProfileFormatError, match="not valid JSON"):
        load_profile("x", env={PROFILE_ENV: "{nope"})


def test_memory_and_step_at_progress():
    assert step_index_at(LAMMPS, 0.0) == 1 and step_index_at(LAMMPS, 0.7) == 2
    assert memory_at(LAMMPS, 0.25) == pytest.approx(416.5)
    assert memory_at(LAMMPS, 0.75) == pytest.approx(1364.0)
    assert memory_at(LAMMPS, 2.0) == pytest.approx(1895.0)
    late = Profile(name="late", memory_steps=(MemoryStep(0.2, 100.0, 200.0),))
    assert step_index_at(late, 0.1) == 0 and memory_at(late, 0.1) == 100.0
    assert memory_at(Profile(name="flat", gpu_memory_max_mb=300.0), 0.5) == 300.0
    assert memory_at(Profile(name="none"), 0.5) == 0.0
    assert peak_memory(LAMMPS) == 1895.0
