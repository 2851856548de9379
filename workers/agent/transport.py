"""How a node agent reaches the portal over the network: the HTTP transport of its syncs and
the listener of its nudges (Redis pub/sub)."""

from __future__ import annotations

import http.client
import logging
import threading
import urllib.parse
from pathlib import Path
from typing import Any

from workers.protocol import (
    AUTH_SCHEME,
    PROTOCOL_VERSION,
    RESULTS_PATH,
    SYNC_PATH,
    ProtocolError,
    SyncReply,
    SyncRequest,
    TransportError,
    nudge_channel,
)

log = logging.getLogger(__name__)


class HttpTransport:
    """``SyncRequest`` as a POST to ``<portal>/agent/v1/sync`` with the node's token."""

    def __init__(
        self,
        portal_url: str,
        token: str,
        *,
        token_file: Path | None = None,
        timeout_s: float = 15.0,
    ) -> None:
        """``token_file``: where the token came from; runners read it there to report a result
        themselves when the agent cannot (without it they wait for the agent)."""
        self.portal_url = portal_url
        self.token_file = None if token_file is None else Path(token_file).absolute()
        parsed = urllib.parse.urlsplit(portal_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"portal URL {portal_url!r}: give http(s)://host[:port]")
        self.scheme = parsed.scheme
        self.host = parsed.hostname
        self.port = parsed.port
        self.path = parsed.path.rstrip("/") + SYNC_PATH
        self.token = token
        self.timeout_s = timeout_s

    def report_target(self) -> dict[str, Any] | None:
        if self.token_file is None:
            return None
        return {
            "url": self.portal_url,
            "path": RESULTS_PATH,
            "token_file": str(self.token_file),
            "version": PROTOCOL_VERSION,
        }

    def sync(self, request: SyncRequest) -> SyncReply:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.request(
                "POST",
                self.path,
                body=request.to_json().encode(),
                headers={
                    "Authorization": f"{AUTH_SCHEME} {self.token}",
                    "Content-Type": "application/json",
                    "X-Cosched-Protocol": str(PROTOCOL_VERSION),
                },
            )
            response = conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise TransportError(f"portal unreachable: {exc}") from None
        finally:
            conn.close()
        if response.status != 200:
            text = body[:300].decode(errors="replace").strip()
            raise TransportError(f"portal answered HTTP {response.status}: {text}")
        try:
            return SyncReply.from_json(body)
        except ProtocolError as exc:
            raise TransportError(f"bad reply from the portal: {exc}") from None


class NudgeListener(threading.Thread):
    """Subscribes to the node's nudge channel and calls ``on_nudge`` for each message (and
    after every (re)subscription, since nudges sent meanwhile were missed). Reconnects with a
    back-off; Redis being down only makes the agent rely on its periodic sync."""

    def __init__(self, url: str, node: str, on_nudge: Any) -> None:
        super().__init__(name=f"nudges-{node}", daemon=True)
        self.url = url
        self.channel = nudge_channel(node)
        self.on_nudge = on_nudge
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        import redis

        backoff = 0.5
        while not self._halt.is_set():
            try:
                client = redis.Redis.from_url(
                    self.url, socket_connect_timeout=2, socket_timeout=5, health_check_interval=10
                )
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.channel)
                self.on_nudge()
                backoff = 0.5
                while not self._halt.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message is not None and message.get("type") == "message":
                        self.on_nudge()
            except Exception as exc:  # redis errors, DNS, ...: try again later
                log.debug("nudge listener: %s", exc)
                self._halt.wait(backoff)
                backoff = min(5.0, backoff * 2)
