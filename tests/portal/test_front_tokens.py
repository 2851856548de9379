"""API tokens: created on the account page (shown once, stored hashed), accepted by the API as
``Authorization: Token <key>``, rejected once revoked. DRF's own tokens keep working."""

from __future__ import annotations

import re

import pytest
from rest_framework.test import APIClient

from portal.front.models import ApiToken
from portal.front.services import hash_key, token_create, token_revoke

pytestmark = pytest.mark.django_db


def api(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_creating_a_token_shows_the_key_once_and_stores_only_its_hash(client, alice):
    client.force_login(alice)
    response = client.post("/account/tokens/", {"name": "gitlab-ci"})
    html = response.content.decode()
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    key = re.search(r'id="new-key">(cos_[\w-]+)<', html).group(1)
    token = ApiToken.objects.get(user=alice)
    assert token.name == "gitlab-ci"
    assert token.key_hash == hash_key(key) and key not in token.key_hash
    assert key.startswith(token.prefix)
    later = client.get("/account/").content.decode()
    assert key not in later
    assert "gitlab-ci" in later and token.prefix in later


def test_the_api_accepts_a_token_and_records_its_use(alice):
    token, key = token_create(alice, name="ci")
    response = api(key).get("/api/v1/me/")
    assert response.status_code == 200
    assert response.json()["username"] == "alice"
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_a_revoked_token_is_rejected_by_the_api(client, alice):
    token, key = token_create(alice, name="ci")
    client.force_login(alice)
    response = client.post(f"/account/tokens/{token.pk}/revoke/", follow=True)
    assert "revoked" in response.content.decode()
    token.refresh_from_db()
    assert token.revoked_at is not None
    answer = api(key).get("/api/v1/me/")
    assert answer.status_code == 401
    assert answer["WWW-Authenticate"] == "Token"
    assert (
        api(key).post("/api/v1/jobs/", {"name": "x", "command": "y"}, format="json").status_code
        == 401
    )


def test_an_unknown_cos_key_is_401(alice):
    assert api("cos_not-a-real-key").get("/api/v1/me/").status_code == 401


def test_revoking_one_token_leaves_the_others_working(alice):
    first, first_key = token_create(alice, name="laptop")
    _, second_key = token_create(alice, name="ci")
    token_revoke(first)
    assert api(first_key).get("/api/v1/me/").status_code == 401
    assert api(second_key).get("/api/v1/me/").status_code == 200


def test_bob_cannot_revoke_alices_token(client, alice, bob):
    token, key = token_create(alice, name="ci")
    client.force_login(bob)
    assert client.post(f"/account/tokens/{token.pk}/revoke/").status_code == 404
    assert api(key).get("/api/v1/me/").status_code == 200


def test_a_blank_or_duplicate_name_is_refused(client, alice):
    token_create(alice, name="ci")
    client.force_login(alice)
    blank = client.post("/account/tokens/", {"name": "  "})
    assert blank.status_code == 400 and "This field is required." in blank.content.decode()
    duplicate = client.post("/account/tokens/", {"name": "ci"})
    assert duplicate.status_code == 400
    assert "already have an active token named" in duplicate.content.decode()
    assert ApiToken.objects.filter(user=alice).count() == 1


def test_revoking_twice_changes_nothing(alice):
    token, _ = token_create(alice, name="ci")
    first = token_revoke(token).revoked_at
    assert token_revoke(token).revoked_at == first


def test_drf_plaintext_tokens_are_gone(alice):
    """DRF's authtoken app (one plain-text key per user) is not installed: a 40-hex key of its
    shape is refused with a message saying what a Cosched key looks like."""
    from django.apps import apps

    assert not apps.is_installed("rest_framework.authtoken")
    response = api("0123456789abcdef0123456789abcdef01234567").get("/api/v1/me/")
    assert response.status_code == 401
    assert "start with cos_" in response.json()["detail"]


def test_tokens_expire_when_an_expiry_is_set(alice, settings):
    from datetime import timedelta

    from django.utils import timezone

    token, key = token_create(alice, name="ci")
    assert token.expires_at is None
    assert api(key).get("/api/v1/me/").status_code == 200
    settings.COSCHED = {**settings.COSCHED, "TOKEN_EXPIRY_DAYS": 30}
    ApiToken.objects.filter(pk=token.pk).update(created_at=timezone.now() - timedelta(days=31))
    response = api(key).get("/api/v1/me/")
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]
    token.refresh_from_db()
    assert token.is_expired and not token.is_active


def test_token_pages_are_post_only(client, alice):
    token, _ = token_create(alice, name="ci")
    client.force_login(alice)
    assert client.get("/account/tokens/").status_code == 405
    assert client.get(f"/account/tokens/{token.pk}/revoke/").status_code == 405
