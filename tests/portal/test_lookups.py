"""portal.core.lookups: a submission's repeated lookups are read once inside the block only."""

from __future__ import annotations

import pytest

from portal.core import lookups


def _counting():
    calls: list[int] = []

    def read() -> int:
        calls.append(1)
        return len(calls)

    return calls, read


def test_outside_a_block_every_call_reads():
    calls, read = _counting()
    assert not lookups.active()
    assert [lookups.remembered("k", read) for _ in range(3)] == [1, 2, 3]


def test_inside_a_block_a_key_is_read_once_and_forgotten_after():
    calls, read = _counting()
    with lookups.submission_lookups():
        assert lookups.active()
        assert lookups.remembered("k", read) == lookups.remembered("k", read) == 1
        assert lookups.remembered("other", read) == 2
        with lookups.submission_lookups():  # a nested block shares the outer one
            assert lookups.remembered("k", read) == 1
    assert not lookups.active()
    assert lookups.remembered("k", read) == 3


def test_a_lookup_that_fails_is_tried_again():
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise LookupError("not yet")
        return "found"

    with lookups.submission_lookups():
        with pytest.raises(LookupError):
            lookups.remembered("k", flaky)
        assert lookups.remembered("k", flaky) == "found" and len(attempts) == 2
