"""Lookups read once per submission (issue 27).

A submission through the API is checked twice: by the serializer (so type errors and rule errors
come back in one 400) and again by ``services.job_submit`` (the business rules hold whoever
calls it). Both read the same things: the registered cluster (admission) and the submitter's
project. Inside ``submission_lookups()`` such a read is made once and reused until the block
ends; outside it every call reads afresh, as before.

The block is one request (one submission, or one bulk submission of many jobs): what it reuses
is at most that request's age, the same snapshot a single read would have given at its start.
Only successful reads are kept (a lookup that raises is tried again). Each thread and each
asyncio task has its own block (``contextvars``), so concurrent requests never share one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")

_memo: ContextVar[dict[Hashable, Any] | None] = ContextVar("cosched_lookups", default=None)


@contextlib.contextmanager
def submission_lookups() -> Iterator[None]:
    """Reuse the lookups of ``remembered`` until the block ends (nested blocks share the
    outermost one)."""
    if _memo.get() is not None:
        yield
        return
    token = _memo.set({})
    try:
        yield
    finally:
        _memo.reset(token)


def active() -> bool:
    """Whether a ``submission_lookups`` block is open here."""
    return _memo.get() is not None


def remembered(key: Hashable, read: Callable[[], T]) -> T:
    """``read()``, or within a ``submission_lookups`` block the value it gave the first time
    for ``key``."""
    memo = _memo.get()
    if memo is None:
        return read()
    if key not in memo:
        memo[key] = read()
    return memo[key]
