"""Writes owned by the browser side: API token creation and revocation.

(Job writes stay in ``portal.core.services``; these live next to the ``ApiToken`` model.)
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.utils import timezone

from portal.front.models import ApiToken

# Every key starts with this, so the authentication class knows a key is ours (and so do secret
# scanners): "cos_" + 40 URL-safe characters (240 bits of randomness).
KEY_PREFIX = "cos_"
PREFIX_SHOWN = 8
MAX_ACTIVE_TOKENS = 20
# last_used_at is refreshed at most this often, so every API call does not write a row.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def hash_key(key: str) -> str:
    """SHA-256 hex digest of a key (keys are random, so a fast hash is enough)."""
    return hashlib.sha256(key.encode()).hexdigest()


def token_create(user: Any, *, name: str) -> tuple[ApiToken, str]:
    """Create a named API token for ``user``; returns ``(token, key)``.

    The plain key is returned only here: the caller shows it once, it is never stored.
    """
    name = name.strip()
    errors: dict[str, list[str]] = {}
    if not name:
        errors["name"] = ["give the token a name, e.g. the pipeline that will use it"]
    elif ApiToken.objects.filter(user=user, name=name, revoked_at=None).exists():
        errors["name"] = [f'you already have an active token named "{name}"']
    if ApiToken.objects.filter(user=user, revoked_at=None).count() >= MAX_ACTIVE_TOKENS:
        errors.setdefault("name", []).append(
            f"at most {MAX_ACTIVE_TOKENS} active tokens; revoke one first"
        )
    if errors:
        raise ValidationError(errors)
    key = KEY_PREFIX + secrets.token_urlsafe(30)
    token = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=key[: len(KEY_PREFIX) + PREFIX_SHOWN],
        key_hash=hash_key(key),
    )
    return token, key


def token_revoke(token: ApiToken) -> ApiToken:
    """Revoke ``token`` (idempotent: revoking a revoked token changes nothing)."""
    ApiToken.objects.filter(pk=token.pk, revoked_at=None).update(revoked_at=timezone.now())
    token.refresh_from_db()
    return token


def token_authenticate(key: str) -> ApiToken | None:
    """The active, unexpired token whose key is ``key``, or None; records the time of use."""
    token = (
        ApiToken.objects.select_related("user")
        .filter(key_hash=hash_key(key), revoked_at=None)
        .first()
    )
    if token is None or not token.user.is_active:
        return None
    if token.is_expired:  # COSCHED["TOKEN_EXPIRY_DAYS"] after creation, when set
        return None
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token
