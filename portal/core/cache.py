"""The cache backend for deployments: Django's Redis cache, degrading when Redis is unreachable.

The cache holds the API's rate-limit counters (``portal.api.throttles``). While Redis is down
a read misses and a write is dropped (logged once a minute), so rate limits are not enforced
for that time but submit, cancel, pause and resume keep working (docs/reliability.md: they
must succeed while the broker is down). Connections give up after a second, so a hung Redis
cannot hold a request either.

Values are JSON (``JSONSerializer``), never pickle: Redis may be reachable from where jobs run,
and a value there must not be able to run code in the portal. A value that is not JSON written
by us (garbage, a pickle) reads as a miss, logged, so a poisoned key costs one cache miss and
never a 500.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from django.core.cache.backends.redis import RedisCache

log = logging.getLogger(__name__)
_last_warning = -float("inf")


def _unavailable(exc: Exception) -> None:
    global _last_warning
    if time.monotonic() - _last_warning > 60:
        _last_warning = time.monotonic()
        log.warning("cache unavailable, rate limits not enforced meanwhile: %s", exc)


def cache_errors() -> tuple[type[Exception], ...]:
    """What a cache operation raises while Redis is unreachable."""
    import redis

    return (redis.exceptions.RedisError, OSError)


_errors = cache_errors


class UnreadableValue(ValueError):
    """A cached value that is not JSON this serializer wrote."""


class JSONSerializer:
    """The Redis cache's serializer: integers as Redis integers (so ``incr`` stays atomic),
    everything else as JSON text. ``loads`` never unpickles: anything else is UnreadableValue."""

    def dumps(self, obj: Any) -> int | bytes:
        if type(obj) is int:  # not bool: True must come back as True
            return obj
        return json.dumps(obj, separators=(",", ":")).encode()

    def loads(self, data: bytes | int) -> Any:
        if isinstance(data, int):
            return data
        try:
            return int(data)
        except ValueError:
            pass
        try:
            return json.loads(data)
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError included
            raise UnreadableValue(f"not a JSON cache value: {exc}") from None


def _unreadable(key: Any, exc: Exception) -> None:
    log.warning("cache key %r holds a value we did not write (read as a miss): %s", key, exc)


class ResilientRedisCache(RedisCache):
    def get(self, key: Any, default: Any = None, version: Any = None) -> Any:
        try:
            return super().get(key, default, version)
        except UnreadableValue as exc:
            _unreadable(key, exc)
            return default
        except _errors() as exc:
            _unavailable(exc)
            return default

    def get_many(self, keys: Any, version: Any = None) -> dict[Any, Any]:
        try:
            return super().get_many(keys, version)
        except UnreadableValue as exc:
            _unreadable(keys, exc)
            return {}
        except _errors() as exc:
            _unavailable(exc)
            return {}

    def set(self, key: Any, value: Any, timeout: Any = None, version: Any = None) -> None:
        try:
            super().set(key, value, timeout, version)
        except _errors() as exc:
            _unavailable(exc)

    def add(self, key: Any, value: Any, timeout: Any = None, version: Any = None) -> bool:
        try:
            return super().add(key, value, timeout, version)
        except _errors() as exc:
            _unavailable(exc)
            return False

    def delete(self, key: Any, version: Any = None) -> bool:
        try:
            return super().delete(key, version)
        except _errors() as exc:
            _unavailable(exc)
            return False


class CheckedHistoryCache:
    """The default cache as DRF's throttles use it (``portal.api.throttles``), except that a
    request history that is not a list of numbers reads as none: a value someone else wrote
    into Redis may be any JSON, and DRF would answer 500 comparing it with the time."""

    def get(self, key: Any, default: Any = None, version: Any = None) -> Any:
        from django.core.cache import cache

        value = cache.get(key, default, version)
        if isinstance(value, list) and all(type(t) in (int, float) for t in value):
            return value  # bool and str are not numbers here
        if value is not default:
            _unreadable(key, UnreadableValue("not a list of request times"))
        return default

    def __getattr__(self, name: str) -> Any:
        from django.core.cache import cache

        return getattr(cache, name)


CHECKED_CACHE = CheckedHistoryCache()
