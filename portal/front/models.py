"""API tokens: several named tokens per user, stored hashed, each revocable on its own.

DRF's ``authtoken`` keeps one plain-text token per user; a CI pipeline, a laptop and a notebook
should each get their own, and a leaked one should be revocable without breaking the others.
The key is shown once at creation; only its SHA-256 digest and a short display prefix are kept.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone


class ApiToken(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, help_text='what it is for, e.g. "gitlab-ci"')
    prefix = models.CharField(max_length=16, help_text="first characters of the key, for display")
    key_hash = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the key, hex")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def expires_at(self) -> datetime | None:
        """``COSCHED["TOKEN_EXPIRY_DAYS"]`` after creation (None: tokens do not expire)."""
        days = int(settings.COSCHED.get("TOKEN_EXPIRY_DAYS") or 0)
        if days <= 0 or self.created_at is None:
            return None
        return self.created_at + timedelta(days=days)

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and timezone.now() >= self.expires_at

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and not self.is_expired
