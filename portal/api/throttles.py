"""A request-rate limit per API token (``DEFAULT_THROTTLE_RATES["token"]``).

DRF's ``UserRateThrottle`` limits a user over all their tokens and sessions together; this one
limits each named token on its own, so one runaway pipeline cannot spend its owner's whole
budget. Requests not made with a token are left to the other throttles.
"""

from __future__ import annotations

from typing import Any

from rest_framework.throttling import SimpleRateThrottle

from portal.front.models import ApiToken


class TokenRateThrottle(SimpleRateThrottle):
    scope = "token"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        token = getattr(request, "auth", None)
        if not isinstance(token, ApiToken):
            return None
        return self.cache_format % {"scope": self.scope, "ident": f"token-{token.pk}"}
