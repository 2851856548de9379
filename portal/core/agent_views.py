"""The node agents' endpoints (``workers.protocol``), JSON over POST:

- ``/agent/v1/sync``: a ``SyncRequest``, answered by a ``SyncReply``
  (``portal.core.agent_sync.agent_sync``);
- ``/agent/v1/results``: a ``ResultReport`` from a runner whose agent did not collect its
  result, answered by a ``ResultAck``.

Authenticated by the node's own token (``Authorization: Bearer cosn_...``, from ``manage.py
node_token create NAME``), valid only for that node's name. Errors are JSON ``{"error": "..."}``:
400 a message that breaks the protocol (the field is named), 401 a missing, unknown or revoked
token, 403 a token of another node, 413 a body over ``MAX_MESSAGE_BYTES``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from portal.core.agent_sync import agent_report_results, agent_sync
from portal.core.nodes import node_token_node
from workers.protocol import (
    AUTH_SCHEME,
    MAX_MESSAGE_BYTES,
    ProtocolError,
    ResultReport,
    SyncRequest,
)


def _error(status: int, message: str) -> JsonResponse:
    response = JsonResponse({"error": message}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = AUTH_SCHEME
    return response


def _handle(request: HttpRequest, parse: Callable[[bytes], Any], serve: Callable[[Any], Any]):
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    key = key.strip()
    if scheme.lower() != AUTH_SCHEME.lower() or not key:
        return _error(401, f"give the node's token: Authorization: {AUTH_SCHEME} <token>")
    try:
        length = int(request.headers.get("Content-Length") or 0)
    except ValueError:
        return _error(400, "bad Content-Length")
    if length > MAX_MESSAGE_BYTES:
        return _error(413, f"a message is at most {MAX_MESSAGE_BYTES} bytes")
    node = node_token_node(key)
    if node is None:
        return _error(401, "unknown or revoked node token")
    try:
        message = parse(request.body)
    except ProtocolError as exc:
        return _error(400, str(exc))
    if message.node != node:
        return _error(403, f"this token is node {node!r}'s; it may not speak for {message.node!r}")
    return HttpResponse(serve(message).to_json(), content_type="application/json")


@csrf_exempt
@require_POST
def sync(request: HttpRequest) -> HttpResponse:
    return _handle(request, SyncRequest.from_json, agent_sync)


@csrf_exempt
@require_POST
def results(request: HttpRequest) -> HttpResponse:
    return _handle(request, ResultReport.from_json, agent_report_results)
