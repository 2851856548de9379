"""The cache backend for deployments: Django's Redis cache, degrading when Redis is unreachable.

The cache holds the API's rate-limit counters (``portal.api.throttles``). While Redis is down
a read misses and a write is dropped (logged once a minute), so rate limits are not enforced
for that time but submit, cancel, pause and resume keep working (docs/reliability.md: they
must succeed while the broker is down). Connections give up after a second, so a hung Redis
cannot hold a request either.
"""

from __future__ import annotations

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


class ResilientRedisCache(RedisCache):
    def get(self, key: Any, default: Any = None, version: Any = None) -> Any:
        try:
            return super().get(key, default, version)
        except _errors() as exc:
            _unavailable(exc)
            return default

    def get_many(self, keys: Any, version: Any = None) -> dict[Any, Any]:
        try:
            return super().get_many(keys, version)
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
