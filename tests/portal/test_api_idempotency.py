"""Idempotency-Key on POST /api/v1/jobs/: a retry returns the same job, never a second one;
the same key with a different body is a 422; concurrent retries make one job."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from rest_framework.test import APIClient

from portal.core.models import Job

URL = "/api/v1/jobs/"
BODY = {"name": "ci-build-42", "command": "make test", "gpus": 1, "params": {"sha": "abc"}}


def _post(client, body, key):
    return client.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


@pytest.mark.django_db
def test_retry_returns_the_same_job(alice_api):
    first = _post(alice_api, BODY, "key-1")
    assert first.status_code == 201
    assert "Idempotent-Replayed" not in first
    second = _post(alice_api, BODY, "key-1")
    assert second.status_code == 200
    assert second["Idempotent-Replayed"] == "true"
    assert second.json()["id"] == first.json()["id"]
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_retry_with_keys_in_another_order_is_the_same_body(alice_api):
    first = _post(alice_api, BODY, "key-2")
    reordered = dict(reversed(list(BODY.items())))
    assert _post(alice_api, reordered, "key-2").json()["id"] == first.json()["id"]


@pytest.mark.django_db
def test_same_key_with_a_different_body_is_a_422(alice_api):
    first = _post(alice_api, BODY, "key-3")
    response = _post(alice_api, {**BODY, "gpus": 2}, "key-3")
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert "key-3" in detail and "different request body" in detail
    assert response.json()["job"] == first.json()["id"]
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_without_a_key_every_post_is_a_new_job(alice_api):
    _post(alice_api, BODY, "")
    alice_api.post(URL, BODY, format="json")
    assert Job.objects.count() == 2


@pytest.mark.django_db
def test_keys_are_per_user(alice_api, bob_api):
    a = _post(alice_api, BODY, "shared-key")
    b = _post(bob_api, BODY, "shared-key")
    assert b.status_code == 201
    assert a.json()["id"] != b.json()["id"]


@pytest.mark.django_db
def test_a_retry_of_a_bad_request_stores_nothing(alice_api):
    assert _post(alice_api, {**BODY, "gpus": -1}, "key-4").status_code == 400
    assert _post(alice_api, BODY, "key-4").status_code == 201
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_an_overlong_key_is_a_400(alice_api):
    response = _post(alice_api, BODY, "k" * 201)
    assert response.status_code == 400
    assert "Idempotency-Key" in response.json()


@pytest.mark.django_db(transaction=True)
def test_concurrent_posts_with_one_key_make_one_job(alice):
    n = 6
    barrier = threading.Barrier(n)
    results: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def worker():
        try:
            client = APIClient()
            client.force_authenticate(user=alice)
            barrier.wait(timeout=10)
            response = _post(client, BODY, "race-key")
            results.append((response.status_code, response.json()["id"]))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert Job.objects.filter(owner=alice).count() == 1
    assert {job_id for _status, job_id in results} == {Job.objects.get().pk}
    statuses = sorted(s for s, _id in results)
    assert statuses.count(201) == 1 and statuses.count(200) == n - 1
