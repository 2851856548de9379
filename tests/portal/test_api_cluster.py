"""Nodes, GPUs and ``/api/v1/me/``."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from portal.core.models import Gpu, Node

pytestmark = pytest.mark.django_db


def test_nodes_list_their_gpus(alice_api):
    node = Node.objects.create(name="gpu-a30", kind="gpu", cores=32, memory_mb=128000)
    Gpu.objects.create(
        node=node,
        index=0,
        model="A30",
        memory_mb=24576,
        sm_count=56,
        sharing_modes=["exclusive", "mps", "mig"],
    )
    Node.objects.create(name="cpu-1", kind="cpu", cores=64)
    body = alice_api.get("/api/v1/nodes/").json()
    assert [n["name"] for n in body["results"]] == ["cpu-1", "gpu-a30"]
    gpus = body["results"][1]["gpus"]
    assert gpus[0]["model"] == "A30" and gpus[0]["node"] == "gpu-a30"
    assert alice_api.get("/api/v1/gpus/").json()["results"][0]["sharing_modes"] == [
        "exclusive",
        "mps",
        "mig",
    ]


def test_me_with_a_named_token(alice):
    from portal.front.services import token_create

    _, key = token_create(alice, name="ci")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    body = client.get("/api/v1/me/").json()
    assert body["username"] == "alice"
    assert body["is_staff"] is False
    assert body["auth"] == "token"


def test_me_with_a_session(client, staff):
    client.force_login(staff)
    body = client.get("/api/v1/me/").json()
    assert (body["username"], body["is_staff"], body["auth"]) == ("sam", True, "session")


def test_me_without_credentials_is_refused(client):
    assert client.get("/api/v1/me/").status_code in (401, 403)


def test_a_bad_token_is_a_401(client):
    response = client.get("/api/v1/me/", HTTP_AUTHORIZATION="Token nope")
    assert response.status_code == 401
