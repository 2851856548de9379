"""Request-rate limits of the API with counters that hold under concurrency (issue 29, part 4).

DRF's ``SimpleRateThrottle`` keeps a list of request times in the cache and writes it back
after reading it: two web workers reading the same list both let their request through, so
under 16 concurrent clients a limit let 14-27% more requests through. Here every request is
one atomic step on a counter:

- on Redis (``portal.core.cache.ResilientRedisCache``): one Lua script (``INCR`` and, on a
  counter without expiry, ``PEXPIRE``) returns the count and the milliseconds left of the
  window;
- on any other cache (the embedded default's process memory): ``cache.add`` then
  ``cache.incr``, which Django's local-memory cache does under its lock.

A window starts with the first request of a client and lasts the rate's period (``60/min``:
60 requests, then 429 with ``Retry-After`` until the minute that began with the first request
is over). While the cache is unreachable every request passes (docs/reliability.md).

Scopes (``DEFAULT_THROTTLE_RATES``): ``anon`` per client address, ``user`` per user over all
their sessions and tokens, ``token`` per named API token (one runaway pipeline cannot spend
its owner's whole budget). The client address is ``REMOTE_ADDR``; ``X-Forwarded-For`` counts
only behind ``COSCHED_TRUSTED_PROXIES`` proxies (DRF's ``NUM_PROXIES``, default 0: ignored,
so a client cannot pick a new identity per request).
"""

from __future__ import annotations

import time
from typing import Any

from django.core.cache import cache as default_cache
from django.core.cache import caches
from redis.exceptions import ResponseError
from rest_framework.throttling import AnonRateThrottle, SimpleRateThrottle, UserRateThrottle

from portal.core.cache import ResilientRedisCache, cache_errors
from portal.front.models import ApiToken

_HIT = """
local n = redis.call('INCR', KEYS[1])
local left = redis.call('PTTL', KEYS[1])
if left < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  left = tonumber(ARGV[1])
end
return {n, left}
"""


def counter_hit(cache: Any, key: str, period_s: int) -> tuple[int, float]:
    """Count one request on ``key``: (requests in the current window, seconds it has left).
    The window opens with the first request and lasts ``period_s``."""
    if isinstance(cache, ResilientRedisCache):
        full_key = cache.make_and_validate_key(key)
        client = cache._cache.get_client(full_key, write=True)
        count, left_ms = client.eval(_HIT, 1, full_key, int(period_s * 1000))
        return int(count), int(left_ms) / 1000
    for _ in range(3):
        if cache.add(key, 1, timeout=period_s):
            cache.set(f"{key}:start", time.time(), timeout=period_s)
            return 1, float(period_s)
        try:
            count = cache.incr(key)
        except ValueError:  # the window ended between add and incr: open the next one
            continue
        started = cache.get(f"{key}:start")
        left = period_s if started is None else max(0.0, started + period_s - time.time())
        return int(count), float(left)
    return 1, float(period_s)


class AtomicRateThrottle(SimpleRateThrottle):
    """``SimpleRateThrottle`` with an atomic counter per window (see the module)."""

    cache = default_cache
    _left = 0.0

    def allow_request(self, request: Any, view: Any) -> bool:
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        backend = caches["default"] if self.cache is default_cache else self.cache
        try:
            try:
                count, self._left = counter_hit(backend, self.key, self.duration)
            except (ResponseError, TypeError, ValueError):
                # Not a counter (written into the cache by someone else, or by an older
                # version's list of times): start the window afresh, never a 500.
                backend.delete(self.key)
                count, self._left = counter_hit(backend, self.key, self.duration)
        except cache_errors():  # Redis down: the limits wait for it (docs/reliability.md)
            return True
        return count <= self.num_requests

    def wait(self) -> float | None:
        return max(self._left, 0.001)


class AnonThrottle(AtomicRateThrottle, AnonRateThrottle):
    """Anonymous callers, per client address (``anon``)."""


class UserThrottle(AtomicRateThrottle, UserRateThrottle):
    """Signed-in callers, per user over all their sessions and tokens (``user``)."""


class TokenRateThrottle(AtomicRateThrottle):
    """Per named API token (``token``); requests not made with a token are left to the others."""

    scope = "token"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        token = getattr(request, "auth", None)
        if not isinstance(token, ApiToken):
            return None
        return self.cache_format % {"scope": self.scope, "ident": f"token-{token.pk}"}
