"""The emulated elastic job (workers/emulate_elastic.py) on its own, without a portal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from workers.emulate_elastic import ElasticRun, main, parse_curve, run, throughput
from workers.report_lines import parse_report

ROOT = Path(__file__).resolve().parents[2]


def test_curve_parsing_and_interpolation():
    curve = parse_curve("1:10, 2:20,4:30")
    assert curve == {1: 10.0, 2: 20.0, 4: 30.0}
    assert throughput(curve, 3) == pytest.approx(25.0)
    assert throughput(curve, 8) == 30.0  # flat beyond the last count
    for bad in ("", "1-10", "0:5", "2:0", "x:1"):
        with pytest.raises(ValueError):
            parse_curve(bad)


def test_without_a_portal_it_trains_at_its_count_to_the_end():
    lines: list[str] = []
    slept: list[float] = []
    state = ElasticRun({1: 10.0, 2: 20.0}, 95, 2, warmup_s=1.0)
    run(state, None, sleep=slept.append, emit=lines.append)
    reports = [parse_report(line) for line in lines]
    assert reports[0].event == "start" and reports[-1].event == "done"
    assert state.done == 95 and state.changes == []
    # 9 windows of 10 batches and one of 5, at 20 steps/s
    assert sum(slept) == pytest.approx(95 / 20.0)


class Scripted:
    """Answers the windows with a fixed script of replies."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.seen = []

    def report_window(self, workers, batches, seconds, rank_rates, remaining, replaced=()):
        self.seen.append((workers, tuple(rank_rates), tuple(replaced)))
        return self.replies.pop(0) if self.replies else None


def test_growth_waits_for_the_warm_up_shrink_does_not_and_a_swap_is_reported():
    # 1 s windows at 10 steps/s with 1 worker; warm-up of 2.5 s
    client = Scripted([{"workers": 2}, {"workers": 2}, {"workers": 2}, {"workers": 2}])
    state = ElasticRun({1: 10.0, 2: 20.0}, 200, 1, warmup_s=2.5)
    run(state, client, sleep=lambda s: None, emit=lambda line: None)
    counts = [w for w, _, _ in client.seen]
    assert counts[:4] == [1, 1, 1, 1] and counts[4] == 2  # joined after the warm-up

    client = Scripted([{"workers": 1}])
    state = ElasticRun({1: 10.0, 2: 20.0}, 50, 2, warmup_s=2.5)
    run(state, client, sleep=lambda s: None, emit=lambda line: None)
    assert [w for w, _, _ in client.seen][:2] == [2, 1]

    # the portal asks until the swap is done (a repeat during the warm-up changes nothing)
    client = Scripted([{"workers": 2, "replace_ranks": [1]}] * 2)
    state = ElasticRun({2: 20.0}, 100, 2, warmup_s=0.5, slow_rank=1, slow_factor=0.5)
    run(state, client, sleep=lambda s: None, emit=lambda line: None)
    assert client.seen[0][1] == (1.0, 0.5)
    swap = next(i for i, (_, _, replaced) in enumerate(client.seen) if replaced == (1,))
    assert client.seen[swap][1] == (1.0, 1.0)  # the spare is healthy
    assert state.changes == ["replace 1"]


def test_usage_errors_exit_2(capsys):
    assert main(["--curve", "nope", "--steps", "10"], client=None) == 2
    assert main(["--curve", "1:10", "--steps", "0"], client=None) == 2


def test_imports_without_django():
    code = (
        "import sys\n"
        "for blocked in ('django', 'celery', 'rest_framework', 'redis'):\n"
        "    sys.modules[blocked] = None\n"
        "import workers.emulate_elastic\nprint('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
