"""The experiments' helpers and the ``python -m scheduler.learning`` command line."""

from __future__ import annotations

import pytest

from scheduler.interference import build_interference
from scheduler.learning.__main__ import main
from scheduler.learning.evaluate import pytorch_pairs, split_pairs
from scheduler.learning.features import REFERENCE_JOB_TYPES
from scheduler.metrics import summarize
from scheduler.policies.registry import build_policy
from scheduler.scenarios import load_scenario
from scheduler.simulator import simulate


def test_held_out_pairs_are_a_seeded_share_without_reference_types():
    pairs = pytorch_pairs()
    assert len(pairs) == 23 * 24 // 2  # 23 non-reference types, self pairs included
    assert not any(p & set(REFERENCE_JOB_TYPES) for p in pairs)
    held = split_pairs(0.25, 0)
    assert len(held) == 69 and held == split_pairs(0.25, 0) and held != split_pairs(0.25, 1)
    assert set(held) <= set(pairs)


def test_coscheml_completes_the_measured_variant_of_coscheml003():
    sc = load_scenario("coscheml003_measured")
    assert len(sc.jobs) == 12 and "coscheml" in sc.policies
    result = simulate(
        sc.cluster,
        sc.jobs,
        build_policy("coscheml"),
        interference=build_interference(sc.interference),
        config=sc.config,
    )
    row = summarize(result)
    assert row["completed"] == 12 and row["oom_count"] == 0
    explanations = result.jobs_frame()["explanation"].tolist()
    assert any(str(e).startswith("paired with job") for e in explanations)


def test_command_line_rejects_bad_arguments(capsys):
    assert main(["holdout", "--fraction", "1.5"]) == 2
    assert "--fraction must be between 0 and 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["scores", "--algorithm", "svm"])
    assert exit_info.value.code == 2
