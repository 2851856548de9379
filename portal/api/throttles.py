"""The API's rate limits: DRF's per address (anonymous) and per user, and one per API token
(``DEFAULT_THROTTLE_RATES["token"]``).

DRF's ``UserRateThrottle`` limits a user over all their tokens and sessions together; the token
throttle limits each named token on its own, so one runaway pipeline cannot spend its owner's
whole budget. Requests not made with a token are left to the other throttles. All three read
their request histories through ``portal.core.cache.CHECKED_CACHE``: a history someone else
wrote into Redis counts as none (never a 500).
"""

from __future__ import annotations

from typing import Any

from rest_framework.throttling import AnonRateThrottle, SimpleRateThrottle, UserRateThrottle

from portal.core.cache import CHECKED_CACHE
from portal.front.models import ApiToken


class AnonThrottle(AnonRateThrottle):
    """DRF's per-address limit for anonymous callers, on the checked cache."""

    cache = CHECKED_CACHE


class UserThrottle(UserRateThrottle):
    """DRF's per-user limit, on the checked cache."""

    cache = CHECKED_CACHE


class TokenRateThrottle(SimpleRateThrottle):
    scope = "token"
    cache = CHECKED_CACHE

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        token = getattr(request, "auth", None)
        if not isinstance(token, ApiToken):
            return None
        return self.cache_format % {"scope": self.scope, "ident": f"token-{token.pk}"}
