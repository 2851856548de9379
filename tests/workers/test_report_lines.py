"""The ``@cosched`` report line format."""

from __future__ import annotations

import pytest

from workers.report_lines import format_report, parse_report


def test_round_trip_reads_numbers_back():
    line = format_report("progress", fraction=0.42, step=2, mem_mb=1895.0, signal="SIGTERM")
    assert line == "@cosched progress fraction=0.42 step=2 mem_mb=1895 signal=SIGTERM"
    report = parse_report(line + "\n")
    assert report.event == "progress"
    assert report.fields == {"fraction": 0.42, "step": 2, "mem_mb": 1895, "signal": "SIGTERM"}
    assert report.get("missing", 5) == 5


def test_ordinary_output_is_not_a_report():
    assert parse_report("epoch 3 loss=0.2") is None
    assert parse_report("@cosched") is None
    assert parse_report("") is None
    assert parse_report("  @cosched done junk =x iters=3").fields == {"iters": 3}


def test_values_with_spaces_are_refused():
    with pytest.raises(ValueError, match="spaces"):
        format_report("start", profile="two words")
