"""Two guards around every request (issue 29: every input answered without a 500).

- ``QueryTextMiddleware``: a query parameter (name or value) holding a NUL character is a 400
  naming the parameter before any view runs: PostgreSQL refuses NUL in text, so a search,
  name or state filter would otherwise fail in the database. JSON under ``/api/``, ``/agent/``
  (``{"<param>": ["..."]}``), plain text for the browser pages.
- ``LostDatabaseMiddleware``: a request whose database connection died under it (a PostgreSQL
  restart, ``pg_terminate_backend``, a failover) is run once more on a fresh connection when it
  is safe to (GET, HEAD, OPTIONS: they write nothing), else answered ``503`` with
  ``Retry-After`` (a write may or may not have committed: the client retries, with its
  ``Idempotency-Key`` where it matters).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

log = logging.getLogger(__name__)

#: Seconds a client waits before it retries a request answered 503 for a lost connection.
RETRY_AFTER_S = 2
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_JSON_PREFIXES = ("/api/", "/agent/", "/metrics")


def wants_json(request: HttpRequest) -> bool:
    return request.path.startswith(_JSON_PREFIXES)


def nul_parameter(request: HttpRequest) -> str | None:
    """The first query parameter whose name or a value holds a NUL character (None: none)."""
    for name, values in request.GET.lists():
        if "\x00" in name:
            return name.replace("\x00", "\\u0000")
        if any("\x00" in value for value in values):
            return name
    return None


class QueryTextMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        name = nul_parameter(request)
        if name is None:
            return self.get_response(request)
        message = "contains a NUL character (\\u0000), which no field may hold"
        if wants_json(request):
            return JsonResponse({name: [message]}, status=400)
        return HttpResponseBadRequest(
            f"Bad request: the query parameter {name!r} {message}.",
            content_type="text/plain; charset=utf-8",
        )


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` means a database connection died (not a query the database refused)."""
    if not isinstance(exc, OperationalError | InterfaceError):
        return False
    return (
        any(conn.connection is not None and not conn.is_usable() for conn in connections.all())
        or isinstance(exc, InterfaceError)
        or _says_lost(exc)
    )


def _says_lost(exc: DatabaseError) -> bool:
    text = str(exc).lower()
    return any(
        phrase in text
        for phrase in (
            "terminating connection",
            "server closed the connection",
            "connection already closed",
            "the connection is closed",
            "consuming input failed",
            "connection to server",
            "ssl connection has been closed",
        )
    )


def _drop_broken_connections() -> None:
    for conn in connections.all(initialized_only=True):
        if conn.in_atomic_block:
            continue  # a test's transaction (or an outer atomic block): not ours to close
        try:
            if conn.connection is not None and not conn.is_usable():
                conn.close()
        except DatabaseError:  # closing a dead connection may itself complain
            conn.connection = None


class LostDatabaseMiddleware:
    """Retry a safe request once on a fresh connection, else a 503 with ``Retry-After``."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if not connection_lost(exc):
            return None
        _drop_broken_connections()
        if request.method in SAFE_METHODS and not getattr(request, "_cosched_retried", False):
            request._cosched_retried = True  # type: ignore[attr-defined]
            match = request.resolver_match
            if match is not None:
                log.warning(
                    "database connection lost during %s %s; retrying once",
                    request.method,
                    request.path,
                )
                try:
                    return _render(match.func(request, *match.args, **match.kwargs))
                except (OperationalError, InterfaceError) as again:
                    if not connection_lost(again):
                        raise
                    _drop_broken_connections()
        log.warning(
            "database connection lost during %s %s; answered 503", request.method, request.path
        )
        return _unavailable(request)


def _render(response: Any) -> HttpResponse:
    render = getattr(response, "render", None)
    if callable(render) and not getattr(response, "is_rendered", True):
        response = render()
    return response


def _unavailable(request: HttpRequest) -> HttpResponse:
    message = "the database connection was lost; retry in a moment"
    if wants_json(request):
        response: HttpResponse = JsonResponse({"detail": message}, status=503)
    else:
        response = HttpResponse(
            f"Service unavailable: {message}.", status=503, content_type="text/plain; charset=utf-8"
        )
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response
