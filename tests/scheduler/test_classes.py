"""Job classes against the seeds' published tables (ALGORITHMS.md §3 Table 7, §4 Tables 3 and 6)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from scheduler.classes import (
    cm_class,
    cm_ratio,
    kernel_class,
    profile_scale_class,
    scale_class,
    sensitivity_class,
)
from scheduler.domain import Profile, StallReasons

SEEDS = Path(__file__).resolve().parents[2] / "scheduler" / "data" / "seeds"


def _table7() -> list[dict[str, str]]:
    with open(SEEDS / "003_kernels_table7.csv", newline="") as f:
        return list(csv.DictReader(f))


def _kernel_profile(row: dict[str, str]) -> Profile:
    return Profile(
        name=row["app"],
        stall=StallReasons(
            exec_dependency=float(row["exec_dependency_pct"]),
            instruction_fetch=float(row["instruction_fetch_pct"]),
            memory_dependency=float(row["memory_dependency_pct"]),
            texture=float(row["texture_pct"]),
            synchronization=float(row["synchronization_pct"]),
            other=float(row["others_pct"]),
        ),
    )


TABLE7 = _table7()


@pytest.mark.parametrize("row", TABLE7, ids=[r["app"] for r in TABLE7])
def test_kernel_class_reproduces_table7(row):
    assert kernel_class(_kernel_profile(row)) == row["type"]


def test_table7_covers_all_three_classes():
    assert {r["type"] for r in TABLE7} == {"compute", "memory", "l1"}
    assert len(TABLE7) == 18


def test_literal_threshold_misses_only_conv():
    # CONV's texture stalls (31.64 %) are below S = 33 %: the literal rule calls it compute.
    wrong = [
        r["app"]
        for r in TABLE7
        if kernel_class(_kernel_profile(r), dominant_fallback=False) != r["type"]
    ]
    assert wrong == ["CONV"]


def test_kernel_class_threshold_is_a_parameter():
    p = Profile("k", stall=StallReasons(memory_dependency=30.0, exec_dependency=40.0))
    assert kernel_class(p) == "compute"
    assert kernel_class(p, threshold_pct=25.0) == "memory"


def test_memory_beats_texture_when_both_over_threshold():
    p = Profile("k", stall=StallReasons(memory_dependency=40.0, texture=45.0))
    assert kernel_class(p) == "memory"


def test_kernel_class_none_without_stalls():
    assert kernel_class(Profile("x")) is None
    assert kernel_class(None) is None


def _table3() -> list[dict[str, str]]:
    with open(SEEDS / "001_cm_ratio_table3.csv", newline="") as f:
        return list(csv.DictReader(f))


TABLE3 = _table3()


@pytest.mark.parametrize("row", TABLE3, ids=[f"{r['model']}-{r['mode']}" for r in TABLE3])
def test_cm_class_reproduces_table3(row):
    expected = {"compute": "C", "memory": "M"}[row["class"]]
    assert cm_class(Profile(row["model"], cm_ratio=float(row["cm_ratio"]))) == expected


def test_cm_threshold_boundary_is_inclusive():
    assert cm_class(Profile("a", cm_ratio=10.0)) == "C"
    assert cm_class(Profile("a", cm_ratio=9.99)) == "M"
    assert cm_class(Profile("a", cm_ratio=9.0), threshold=8.0) == "C"


def test_cm_falls_back_to_sm_efficiency_over_mem_util():
    assert cm_ratio(Profile("a", sm_efficiency_pct=80.0, mem_util_pct=4.0)) == pytest.approx(20.0)
    assert cm_class(Profile("a", sm_efficiency_pct=80.0, mem_util_pct=4.0)) == "C"
    assert cm_class(Profile("a", sm_efficiency_pct=60.0, mem_util_pct=30.0)) == "M"
    # The explicit ratio wins over the fallback.
    assert cm_class(Profile("a", cm_ratio=3.0, sm_efficiency_pct=90.0, mem_util_pct=1.0)) == "M"


def test_cm_class_none_when_missing():
    assert cm_class(Profile("a")) is None
    assert cm_class(Profile("a", sm_efficiency_pct=50.0)) is None
    assert cm_class(None) is None


@pytest.mark.parametrize(
    ("batch", "image", "expected"),
    [
        (5, 56, "small"),  # Table 6 as printed
        (8, 56, "small"),  # the sensitivity study's small
        (16, 224, "medium"),
        (48, 448, "big"),
        (64, 448, "big"),
        (64, 640, "big"),
    ],
)
def test_scale_class_reproduces_table6(batch, image, expected):
    assert scale_class(batch, image) == expected


def test_scale_class_boundaries_and_missing():
    assert scale_class(1, 387) == "small"  # 149,769 pixels
    assert scale_class(1, 388) == "medium"  # 150,544 pixels
    assert scale_class(None, 224) is None
    assert scale_class(16, None) is None
    assert scale_class(0, 224) is None
    assert profile_scale_class(Profile("r", batch_size=48, image_size=448)) == "big"
    assert profile_scale_class(Profile("r")) is None


def test_sensitivity_class():
    assert sensitivity_class(Profile("vgg16", sensitivity=3.1)) == "high"
    assert sensitivity_class(Profile("yolo", sensitivity=1.2)) == "low"
    assert sensitivity_class(Profile("edge", sensitivity=2.0)) == "high"
    assert sensitivity_class(Profile("yolo", sensitivity=1.2), high_min=1.1) == "high"
    assert sensitivity_class(Profile("x")) is None
