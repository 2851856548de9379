"""The quick chaos run (tests/e2e/chaos.py, ``make chaos`` for the full one): the real stack
with short leases under four faults; nothing lost, nothing run twice or at once, nothing stuck,
every attempt's outcome recorded."""

from __future__ import annotations

import pytest

from portal.core.outbox import CYCLE_PENDING_KEY
from tests.e2e.chaos import CYCLE_MARKER, QUICK, format_row, run


def test_the_suite_drops_cycle_messages_through_the_real_marker():
    assert CYCLE_MARKER == CYCLE_PENDING_KEY


@pytest.mark.slow
def test_quick_chaos_loses_nothing_and_runs_nothing_twice_or_at_once():
    rows = run(quick=True)
    assert [r.fault for r in rows] == list(QUICK.faults)
    for row in rows:
        assert row.ok, format_row(row)
        assert row.jobs >= QUICK.jobs and row.recover_s is not None, format_row(row)
    by_fault = {r.fault: r for r in rows}
    # The faults happened and did what they should: the killed agent's jobs were adopted by
    # its successor (no restart); the frozen agent's long jobs were stopped by their runners
    # when the lease ran out and ran again elsewhere, never beside themselves.
    assert by_fault["agent-kill"].restarts == 0, format_row(by_fault["agent-kill"])
    assert by_fault["agent-freeze"].restarts >= 1, format_row(by_fault["agent-freeze"])
    notes = " ".join(by_fault["redis-down"].notes)
    assert "HTTP [201, 200]" in notes and "process gone after" in notes, notes
