"""The GPU catalogue's sharing configuration: modes per model, MPS thread limit, MIG layouts."""

from __future__ import annotations

import pytest

from scheduler.catalog import (
    CATALOG,
    MigLayoutError,
    check_mig_layout,
    has_mps_thread_limit,
    mig_layouts,
    place_mig_layout,
    sharing_summary,
    valid_mig_layout,
)
from scheduler.cluster_spec import parse_cluster_spec
from scheduler.domain import SharingMode


@pytest.mark.parametrize("model", sorted(CATALOG))
def test_mps_runs_on_every_catalogue_model(model):
    # Kepler (K80) and later run MPS; paper 001's "Volta and newer" is the thread limit.
    assert CATALOG[model].supports(SharingMode.MPS)
    assert CATALOG[model].supports(SharingMode.TIME_SLICING)


def test_thread_limit_from_volta_on():
    limited = {m for m, s in CATALOG.items() if s.mps_thread_limit}
    assert limited == {"V100", "T4", "RTX2080Ti", "QuadroRTX6000", "A30", "A100", "H100", "H200"}
    assert not has_mps_thread_limit("Pascal") and has_mps_thread_limit("Volta")
    assert not has_mps_thread_limit("SomethingNew")  # unknown: no limit assumed


def test_mig_only_on_ampere_and_hopper():
    assert {m for m, s in CATALOG.items() if s.supports(SharingMode.MIG)} == {
        "A30",
        "A100",
        "H100",
        "H200",
    }
    assert [p.name for p in CATALOG["A30"].mig_profiles] == ["1g.6gb", "2g.12gb", "4g.24gb"]


def test_a30_layouts_are_the_four_nvidia_lists():
    assert set(mig_layouts(CATALOG["A30"])) == {
        ("4g.24gb",),
        ("2g.12gb", "2g.12gb"),
        ("2g.12gb", "1g.6gb", "1g.6gb"),
        ("1g.6gb", "1g.6gb", "1g.6gb", "1g.6gb"),
    }


def test_placement_rules_reject_layouts_that_fit_the_slices():
    a100 = CATALOG["A100"]
    # 3 + 3 + 1 = 7 compute slices, but two 3g.20gb take all eight memory slices.
    assert not valid_mig_layout(a100, ["3g.20gb", "3g.20gb", "1g.5gb"])
    with pytest.raises(MigLayoutError, match="overlap"):
        check_mig_layout(a100, ["3g.20gb", "3g.20gb", "1g.5gb"])
    assert valid_mig_layout(a100, ["4g.20gb", "3g.20gb"])
    assert place_mig_layout(a100, ["3g.20gb", "4g.20gb"]) == (4, 0)
    assert len(mig_layouts(a100)) == 12 and ("7g.40gb",) in mig_layouts(a100)


def test_layout_errors_name_the_problem():
    a30 = CATALOG["A30"]
    with pytest.raises(MigLayoutError, match="no MIG profile '3g.20gb'"):
        check_mig_layout(a30, ["3g.20gb"])
    with pytest.raises(MigLayoutError, match="needs 6 compute slices"):
        check_mig_layout(a30, ["4g.24gb", "2g.12gb"])
    with pytest.raises(MigLayoutError, match="has no MIG"):
        check_mig_layout(CATALOG["V100"], ["1g.5gb"])


def test_summary_says_what_each_model_allows():
    assert "MPS without thread limit" in sharing_summary(CATALOG["TitanXp"])
    assert "1g.6gb, 2g.12gb, 4g.24gb" in sharing_summary(CATALOG["A30"])


def test_cluster_spec_sets_or_derives_the_thread_limit():
    spec = parse_cluster_spec(
        {
            "gpu_models": {
                "TitanXp": {"mps_thread_limit": True},
                "L40": {
                    "architecture": "Ada",
                    "memory_mb": 46068,
                    "sm_count": 142,
                    "dram_bw_gbps": 864,
                    "peak_gflops": 90500,
                },
            },
            "nodes": [{"name": "a", "gpu_model": "TitanXp"}, {"name": "b", "gpu_model": "L40"}],
        }
    )
    assert spec.gpu_spec("TitanXp").mps_thread_limit
    assert spec.gpu_spec("L40").mps_thread_limit  # Ada is after Volta
