"""DRF authentication for named API tokens (``Authorization: Token cos_…``).

It runs before DRF's own ``TokenAuthentication`` and only claims keys with our ``cos_`` prefix;
any other key is left to ``TokenAuthentication`` (DRF ``authtoken`` keys keep working). Listed
first, it also supplies the ``WWW-Authenticate: Token`` header, so unauthenticated API calls get
401, not 403.
"""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions

from portal.front.services import KEY_PREFIX, token_authenticate


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Token"

    def authenticate(self, request: Any) -> tuple[Any, Any] | None:
        parts = authentication.get_authorization_header(request).split()
        if len(parts) != 2 or parts[0].decode(errors="replace").lower() != self.keyword.lower():
            return None
        try:
            key = parts[1].decode()
        except UnicodeError:
            return None
        if not key.startswith(KEY_PREFIX):
            return None  # not ours: DRF's TokenAuthentication decides
        token = token_authenticate(key)
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        return token.user, token

    def authenticate_header(self, request: Any) -> str:
        return self.keyword
