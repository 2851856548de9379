"""Throttles that hold (issue 29, part 4): on a real Redis, 16 threads hammering one client's
budget get exactly the limit through (within 1%) for each scope (anonymous, per user, per
token); a new ``X-Forwarded-For`` per request does not make a new anonymous client unless the
portal is told it sits behind that many trusted proxies."""

from __future__ import annotations

import os
import threading
import uuid

import pytest
from django.contrib.auth.models import AnonymousUser
from rest_framework.request import ForcedAuthentication, Request
from rest_framework.test import APIRequestFactory
from rest_framework.throttling import SimpleRateThrottle

from portal.api.throttles import AnonThrottle, TokenRateThrottle, UserThrottle
from portal.core.cache import ResilientRedisCache
from portal.front.services import token_create

pytestmark = pytest.mark.django_db

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
LIMIT = 200
THREADS = 16
TRIES = 40  # per thread: 640 requests for a budget of 200


@pytest.fixture
def redis_cache(settings, monkeypatch):
    settings.CACHES = {
        "default": {
            "BACKEND": "portal.core.cache.ResilientRedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": f"throttle-test-{uuid.uuid4().hex}",  # no clear(): the db is shared
        }
    }
    from django.core.cache import caches

    assert isinstance(caches["default"], ResilientRedisCache)
    rate = f"{LIMIT}/hour"
    monkeypatch.setattr(
        SimpleRateThrottle, "THROTTLE_RATES", {"anon": rate, "user": rate, "token": rate}
    )
    yield caches["default"]


def _request(user=None, token=None, xff: str | None = None) -> Request:
    extra = {"REMOTE_ADDR": "203.0.113.7"}
    if xff is not None:
        extra["HTTP_X_FORWARDED_FOR"] = xff
    raw = APIRequestFactory().get("/api/v1/jobs/", **extra)
    return Request(raw, authenticators=(ForcedAuthentication(user or AnonymousUser(), token),))


def _hammer(throttle_class, make_request) -> int:
    barrier = threading.Barrier(THREADS)
    allowed = [0] * THREADS

    def run(i: int) -> None:
        barrier.wait()
        for _ in range(TRIES):
            if throttle_class().allow_request(make_request(), None):
                allowed[i] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return sum(allowed)


def test_the_anonymous_limit_holds_under_16_clients_with_forged_forwarded_for(redis_cache):
    passed = _hammer(AnonThrottle, lambda: _request(xff=f"10.{uuid.uuid4().int % 250}.0.1"))
    assert abs(passed - LIMIT) <= LIMIT // 100, passed


def test_the_per_user_limit_holds_under_16_clients(redis_cache, alice):
    passed = _hammer(UserThrottle, lambda: _request(alice))
    assert abs(passed - LIMIT) <= LIMIT // 100, passed


def test_the_per_token_limit_holds_under_16_clients(redis_cache, alice):
    token, _ = token_create(alice, name="ci")
    passed = _hammer(TokenRateThrottle, lambda: _request(alice, token))
    assert abs(passed - LIMIT) <= LIMIT // 100, passed


def test_a_refused_request_says_when_the_window_ends(redis_cache, alice):
    throttle = UserThrottle()
    for _ in range(LIMIT):
        assert throttle.allow_request(_request(alice), None)
    assert not throttle.allow_request(_request(alice), None)
    assert 3500 < throttle.wait() <= 3600


def test_forwarded_for_counts_only_behind_trusted_proxies(redis_cache, settings):
    first = _request(xff="198.51.100.1")
    second = _request(xff="198.51.100.2")
    throttle = AnonThrottle()
    assert throttle.get_cache_key(first, None) == throttle.get_cache_key(second, None)
    assert "203.0.113.7" in throttle.get_cache_key(first, None)
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    assert throttle.get_cache_key(first, None) != throttle.get_cache_key(second, None)
    assert "198.51.100.1" in throttle.get_cache_key(first, None)


def test_the_default_trusts_no_proxy():
    from django.conf import settings

    assert settings.REST_FRAMEWORK["NUM_PROXIES"] == 0
    classes = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"]
    assert classes == [
        "portal.api.throttles.AnonThrottle",
        "portal.api.throttles.UserThrottle",
        "portal.api.throttles.TokenRateThrottle",
    ]


def test_anonymous_api_calls_are_limited_whatever_they_forward(client, redis_cache, monkeypatch):
    monkeypatch.setattr(
        SimpleRateThrottle, "THROTTLE_RATES", {"anon": "3/min", "user": "9/min", "token": "9/min"}
    )
    codes = [
        client.get("/api/schema/?format=json", HTTP_X_FORWARDED_FOR=f"192.0.2.{i}").status_code
        for i in range(5)
    ]
    assert codes == [200, 200, 200, 429, 429]
