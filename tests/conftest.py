"""Shared fixtures: three users (owner, teammate, outsider... here alice, bob and staff) so
permission tests read like sentences, and API clients logged in as each."""

from __future__ import annotations

import pytest


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", "alice@example.org", "alice-pass-123")


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user("bob", "bob@example.org", "bob-pass-123")


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user(
        "sam", "sam@example.org", "sam-pass-123", is_staff=True, is_superuser=True
    )


def _api_client(user):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user=user)
    return client


@pytest.fixture
def alice_api(alice):
    return _api_client(alice)


@pytest.fixture
def bob_api(bob):
    return _api_client(bob)


@pytest.fixture
def staff_api(staff):
    return _api_client(staff)
