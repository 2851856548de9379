"""Fixtures of the portal tests (the shared users and API clients are in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fresh_rate_limits():
    """The API's throttles count in the cache, which outlives a test: each test starts with
    fresh counters, so the order tests run in cannot make one of them see a 429."""
    from django.core.cache import cache

    cache.clear()
    yield
