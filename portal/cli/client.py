"""The ``cosched`` CLI's HTTP side: the REST client (retries, timeouts, token), the error it
raises (``CliError``) and the stable exit codes every failure maps to."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import requests

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED"})
RETRYABLE_STATUS = frozenset({502, 503, 504})

EXIT_OK = 0
EXIT_JOB_NOT_COMPLETED = 1
EXIT_BAD_INPUT = 2
EXIT_AUTH = 3
EXIT_NOT_FOUND = 4
EXIT_SERVER = 5
EXIT_TIMEOUT = 6
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A failure to report in one readable message, with the exit code it maps to."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Client:
    """The REST API at ``url`` with ``token``. Every failure becomes a ``CliError``."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        retries: int = 2,
        timeout_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.retries = retries
        self.timeout_s = timeout_s
        self.sleep = sleep
        self.session = requests.Session()
        self.session.headers["Accept"] = "application/json"
        self.session.headers["User-Agent"] = "cosched-cli"
        if token:
            self.session.headers["Authorization"] = f"Token {token}"

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        retry: bool | None = None,
        not_found: str = "not found",
        raw: bool = False,
    ) -> tuple[int, Any]:
        """Send one request; returns ``(status, decoded JSON body)`` for a 2xx answer (with
        ``raw``: the body as text).

        ``retry`` (default: GET only) retries connection failures and 502/503/504 with a short
        back-off; a POST is retried only when it is safe (an Idempotency-Key is sent).
        """
        if not self.token:
            raise CliError(
                "no API token: set COSCHED_TOKEN or pass --token "
                f"(create one on {self.url}/account/)",
                EXIT_AUTH,
            )
        retry = method == "GET" if retry is None else retry
        attempts = 1 + (self.retries if retry else 0)
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = self.session.request(
                    method,
                    self.url + path,
                    json=body,
                    params=params,
                    headers=headers,
                    timeout=self.timeout_s,
                )
            except requests.ConnectionError as exc:
                if last:
                    raise CliError(_connection_message(self.url, exc), EXIT_SERVER) from None
            except requests.Timeout:
                if last:
                    raise CliError(
                        f"the Cosched server at {self.url} did not answer within "
                        f"{self.timeout_s:g} s",
                        EXIT_SERVER,
                    ) from None
            except requests.RequestException as exc:
                raise CliError(f"request to {self.url} failed: {exc}", EXIT_SERVER) from None
            else:
                if raw and 200 <= response.status_code < 300:
                    response.encoding = "utf-8"
                    return response.status_code, response.text
                if response.status_code not in RETRYABLE_STATUS or last:
                    return self._decode(response, not_found)
            self.sleep(min(2.0**attempt, 10.0))
        raise AssertionError("unreachable")

    def _decode(self, response: requests.Response, not_found: str) -> tuple[int, Any]:
        status = response.status_code
        try:
            data = response.json()
        except ValueError:
            data = None
        if 200 <= status < 300:
            if data is None and status != 204:
                raise CliError(
                    f"{self.url} answered HTTP {status} without JSON: is COSCHED_URL the "
                    "Cosched portal?",
                    EXIT_SERVER,
                )
            return status, data
        detail = data.get("detail") if isinstance(data, dict) else None
        if status == 401:
            raise CliError(
                f"authentication failed (HTTP 401): {(detail or 'invalid token').rstrip('.')}. "
                "Check "
                f"COSCHED_TOKEN or --token; tokens are made on {self.url}/account/",
                EXIT_AUTH,
            )
        if status == 403:
            raise CliError(f"permission denied (HTTP 403): {detail or 'forbidden'}", EXIT_AUTH)
        if status == 404:
            if data is None:
                raise CliError(
                    f"{response.url} is not a Cosched API endpoint (HTTP 404): check "
                    "COSCHED_URL or --url",
                    EXIT_NOT_FOUND,
                )
            raise CliError(not_found, EXIT_NOT_FOUND)
        if status in (400, 422):
            raise CliError(_field_errors_message(data), EXIT_BAD_INPUT)
        if status == 409:
            raise CliError(detail or "conflict (HTTP 409)", EXIT_JOB_NOT_COMPLETED)
        if status >= 500:
            raise CliError(
                f"the Cosched server failed (HTTP {status}); try again later", EXIT_SERVER
            )
        raise CliError(f"unexpected answer HTTP {status}: {detail or data}", EXIT_SERVER)


def _connection_message(url: str, exc: Exception) -> str:
    text = str(exc)
    if "refused" in text.lower():
        reason = "connection refused"
    elif "name or service not known" in text.lower() or "resolve" in text.lower():
        reason = "unknown host"
    else:
        reason = "connection failed"
    return (
        f"cannot reach the Cosched server at {url}: {reason}. "
        "Is it running? Set COSCHED_URL or --url"
    )


def _field_errors_message(data: Any) -> str:
    """A 400 body (field -> messages) as one line per field."""
    if not isinstance(data, dict):
        return f"the server rejected the request: {data}"
    if set(data) == {"detail"} or ("detail" in data and "job" in data):
        return f"the server rejected the request: {data['detail']}"
    jobs = data.get("jobs")
    if isinstance(jobs, dict) and all(str(k).isdigit() for k in jobs):  # a bulk submission
        lines = ["the server rejected the jobs (none was submitted):"]
        for index, fields in jobs.items():
            for field, messages in fields.items() if isinstance(fields, dict) else [("", fields)]:
                for message in messages if isinstance(messages, list) else [messages]:
                    lines.append(f"  job {index} (from 0): {field}: {message}")
        return "\n".join(lines)
    lines = ["the server rejected the job:"]
    for field, messages in data.items():
        if isinstance(messages, dict):  # nested (e.g. params)
            messages = [f"{k}: {v}" for k, v in messages.items()]
        elif not isinstance(messages, list):
            messages = [messages]
        for message in messages:
            lines.append(f"  {field}: {message}")
    return "\n".join(lines)
