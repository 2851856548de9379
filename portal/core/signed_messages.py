"""Signed JSON for every Celery message (tasks and remote control): a kombu serializer.

Redis is reachable from more places than the portal (a lab's Redis without a password, a node
whose jobs share its network). Whoever can ``LPUSH`` into a queue must not get a task executed:
each message body is JSON with an HMAC-SHA256 over it, keyed from ``COSCHED_CELERY_SIGNING_KEY``
(default: derived from ``SECRET_KEY``), and the Celery app accepts this content type only
(``portal.settings``: ``CELERY_ACCEPT_CONTENT``). A body without a valid signature is not
decoded: the worker logs it and drops it. Pickle is never accepted anywhere.

The task's name is inside the signed body (Celery's message protocol 1, ``CELERY_TASK_PROTOCOL``)
and ``portal.celery.SignedTask`` refuses to run when the name a message's headers give differs
from the signed one, so a signed body copied into a message naming another task runs nothing.
What a signature cannot prevent is a replay of a message that was sent (a task runs once
more): every task of ours is idempotent (a scheduling cycle, a relay, a snapshot).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from kombu.serialization import register

NAME = "cosched-signed-json"
CONTENT_TYPE = "application/x-cosched-signed+json"
_PREFIX = "v1:"


class BadSignature(ValueError):
    """The message was not signed with this deployment's key (or was altered)."""


def _key() -> bytes:
    from django.conf import settings

    secret = getattr(settings, "CELERY_SIGNING_KEY", "") or settings.SECRET_KEY
    # A key of its own, so a signature here is no signature anywhere else SECRET_KEY signs.
    return hashlib.sha256(b"cosched-celery-messages\x00" + secret.encode()).digest()


def _mac(key: bytes, payload: str) -> str:
    return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()


def dumps(obj: Any) -> str:
    """``v1:<hex HMAC-SHA256>:<JSON>``."""
    payload = json.dumps(obj, separators=(",", ":"), sort_keys=True)
    return f"{_PREFIX}{_mac(_key(), payload)}:{payload}"


def loads(data: str | bytes) -> Any:
    """The object of a body ``dumps`` wrote with this key; BadSignature for anything else."""
    if isinstance(data, bytes | bytearray | memoryview):
        data = bytes(data).decode("utf-8")
    if not data.startswith(_PREFIX):
        raise BadSignature("not a signed message")
    mac, sep, payload = data[len(_PREFIX) :].partition(":")
    if not sep or not hmac.compare_digest(mac, _mac(_key(), payload)):
        raise BadSignature("bad message signature")
    # Task (protocol 1) and control bodies are mappings. Eager tasks (the embedded default)
    # pass their (args, kwargs) through the serializer too, as a list, which never crosses
    # Redis; a worker runs only a mapping naming its task (``portal.celery.SignedRequest``).
    return json.loads(payload)


def register_serializer() -> None:
    """Make ``NAME`` known to kombu (idempotent)."""
    register(NAME, dumps, loads, content_type=CONTENT_TYPE, content_encoding="utf-8")
