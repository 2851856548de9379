"""Authentication: named API tokens for the REST API, and the login lockout backend.

``ApiTokenAuthentication`` reads ``Authorization: Token cos_…`` (hashed, named, revocable keys;
DRF's plain-text ``authtoken`` is not installed). Listed first, it also supplies the
``WWW-Authenticate: Token`` header, so unauthenticated API calls get 401, not 403.

``LockoutBackend`` is django-axes' backend: it refuses a login while its username and address
are locked out after repeated failures. A login without an HTTP request (``manage.py`` commands,
the test client's ``login``) is not an attack surface and is left to the next backend.
"""

from __future__ import annotations

from typing import Any

from axes.backends import AxesStandaloneBackend
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
            raise exceptions.AuthenticationFailed(
                "Invalid token: Cosched API tokens start with cos_ (account page -> API tokens)."
            )
        token = token_authenticate(key)
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid, revoked or expired token.")
        return token.user, token

    def authenticate_header(self, request: Any) -> str:
        return self.keyword


class LockoutBackend(AxesStandaloneBackend):
    """django-axes' lockout check for logins that come with an HTTP request."""

    def authenticate(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        if request is None:
            return None
        return super().authenticate(request, *args, **kwargs)
