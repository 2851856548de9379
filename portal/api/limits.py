"""Request limits of the REST API: body size (JSON 413), JSON nesting, and errors as JSON.

- ``ApiBodyLimitMiddleware``: an ``/api/`` request whose body is larger than
  ``COSCHED["API_MAX_BODY_BYTES"]`` is answered ``413`` with a JSON ``detail`` before any view
  reads it (the browser pages keep Django's own limits).
- ``BoundedJSONParser``: a JSON body nested deeper than ``MAX_BODY_DEPTH`` is a 400 naming the
  depth (Python's decoder would otherwise hit its recursion limit: a 500).
- ``exception_handler``: DRF's, plus a JSON 413 for a body Django refused while reading it
  (chunked uploads without a Content-Length).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework import status
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.response import Response

from workers.protocol import JsonTooDeep, loads_bounded

MAX_BODY_DEPTH = 64


def max_body_bytes() -> int:
    return int(settings.COSCHED.get("API_MAX_BODY_BYTES", 4 * 1024 * 1024))


def _too_large(size: int | None) -> dict[str, Any]:
    limit = max_body_bytes()
    got = f"{size:,} bytes" if size is not None else "more"
    return {
        "detail": f"request body too large: {got}; the API takes at most {limit:,} bytes",
        "limit_bytes": limit,
    }


class ApiBodyLimitMiddleware:
    """JSON 413 for an oversized API request body (checked on Content-Length)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith("/api/"):
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if length > max_body_bytes():
                return JsonResponse(_too_large(length), status=413)
        return self.get_response(request)


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser with a nesting limit checked before decoding, finite numbers only."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        raw = stream.read() if stream is not None else b""
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            return loads_bounded(raw.decode(encoding), MAX_BODY_DEPTH)
        except JsonTooDeep as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        except ValueError as exc:  # UnicodeDecodeError included
            raise ParseError(f"JSON parse error - {exc}") from None


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, RequestDataTooBig):
        return Response(_too_large(None), status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    from rest_framework.views import exception_handler as drf_exception_handler  # import cycle

    return drf_exception_handler(exc, context)
