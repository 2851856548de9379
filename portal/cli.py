"""``cosched``: submit and follow Cosched jobs from a terminal or a CI pipeline.

A plain HTTP client of the REST API (``requests``); it imports nothing from Django.

    export COSCHED_URL=https://cosched.example.org   # default http://127.0.0.1:8000
    export COSCHED_TOKEN=cos_...                      # account page -> API tokens
    cosched submit job.yaml        # prints the job id and state
    cosched wait 42 --timeout 3600 # exit code 0 only if the job COMPLETED
    cosched status 42 | cosched cancel 42 | cosched jobs --state PENDING,RUNNING
    cosched history --since 7d --state FAILED   # finished jobs, like sacct

The job file (YAML or JSON) holds the API's job fields: ``name``, ``command``, ``profile`` (an
id, or the name of an approved profile), ``gpus``, ``gpu_memory_mb``, ``cpus``, ``memory_mb``,
``sharing``, ``device``, ``kind``, ``params``, ``priority``, ``time_limit`` (and
``container_image``, ``elastic_min_workers``, ``elastic_max_workers``, ``elastic_deadline_s`` or
``elastic_value_per_hour``, ``max_global_batch``). ``submit --time-limit`` overrides the file's
``time_limit``.

Retries are safe: ``submit`` sends an ``Idempotency-Key`` derived from the job file's bytes
(``cli-<sha256>``), so a CI step that is retried with the same file gets the job the first try
created instead of a second one. The flip side: submitting the *same file* again on purpose
returns the existing job; pass ``--idempotency-key`` (e.g. ``"$CI_PIPELINE_ID-train"``) or
``--no-idempotency-key`` to get a new job.

Exit codes (stable, for scripts):
  0  success; for ``wait``: the job COMPLETED
  1  the job ended FAILED or CANCELLED (``wait``), or could not be cancelled (already finished)
  2  bad input: usage, an unreadable or invalid job file, fields the server rejected (HTTP 400)
  3  authentication or permission: no token, a wrong or revoked token (HTTP 401 / 403)
  4  not found (HTTP 404): no such job, or not yours
  5  server unreachable or failing (connection refused, timeout, HTTP 5xx)
  6  ``wait --timeout`` ran out before the job finished
  130 interrupted (Ctrl-C); the job itself is not cancelled
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import shutil
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, Any, NoReturn

import requests
import yaml

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


# -- HTTP -------------------------------------------------------------------------------------


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


# -- job files --------------------------------------------------------------------------------


def load_job_file(path: str, stdin: IO[bytes] | None = None) -> tuple[dict[str, Any], bytes]:
    """Read a YAML or JSON job file (``-`` = standard input); returns ``(fields, raw bytes)``."""
    try:
        raw = (stdin or sys.stdin.buffer).read() if path == "-" else Path(path).read_bytes()
    except FileNotFoundError:
        raise CliError(f"{path}: no such file", EXIT_BAD_INPUT) from None
    except IsADirectoryError:
        raise CliError(f"{path}: is a directory, not a job file", EXIT_BAD_INPUT) from None
    except OSError as exc:
        raise CliError(f"{path}: cannot read: {exc.strerror}", EXIT_BAD_INPUT) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CliError(f"{path}: not a text file (UTF-8 expected)", EXIT_BAD_INPUT) from None
    if path.lower().endswith(".json"):
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CliError(
                f"{path}: not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
                EXIT_BAD_INPUT,
            ) from None
    else:
        try:
            fields = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            where = ""
            mark = getattr(exc, "problem_mark", None)
            if mark is not None:
                where = f" (line {mark.line + 1}, column {mark.column + 1})"
            problem = getattr(exc, "problem", None) or "syntax error"
            raise CliError(f"{path}: not valid YAML: {problem}{where}", EXIT_BAD_INPUT) from None
    if not isinstance(fields, dict) or not fields:
        raise CliError(
            f"{path}: a job file is a mapping of job fields (name, command, gpus, ...), "
            f"got {type(fields).__name__ if fields is not None else 'an empty file'}",
            EXIT_BAD_INPUT,
        )
    bad_keys = [k for k in fields if not isinstance(k, str)]
    if bad_keys:
        raise CliError(f"{path}: field names must be strings, got {bad_keys!r}", EXIT_BAD_INPUT)
    return fields, raw


def default_idempotency_key(raw: bytes) -> str:
    """``cli-`` + SHA-256 of the job file's bytes: the same file gives the same key."""
    return "cli-" + hashlib.sha256(raw).hexdigest()


# -- output -----------------------------------------------------------------------------------


def _when(value: str | None) -> str:
    if not value:
        return "-"
    try:
        return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M:%S %Z").strip()
    except ValueError:
        return value


def _job_lines(job: dict[str, Any]) -> list[str]:
    rows: list[tuple[str, Any]] = [
        ("job", f"{job.get('id')}  {job.get('name', '')}"),
        ("state", job.get("state")),
        *([("waiting", job["waiting_reason"])] if job.get("waiting_reason") else []),
        ("owner", job.get("owner")),
        *([("project", job["project"])] if job.get("project") else []),
        ("kind", job.get("kind")),
        ("profile", _profile_text(job)),
        ("gpus", job.get("gpus")),
        ("gpu memory", f"{job['gpu_memory_mb']} MB" if job.get("gpu_memory_mb") else "-"),
        *([("sharing", job["sharing"])] if job.get("gpus") and job.get("sharing") else []),
        *([("device", job["device"])] if job.get("device") else []),
        ("cpus", job.get("cpus")),
        *([("memory", f"{job['memory_mb']} MB")] if job.get("memory_mb") else []),
        ("priority", job.get("priority")),
        *([("time limit", _limit_text(job))] if job.get("time_limit") else []),
        ("submitted", _when(job.get("submitted_at"))),
    ]
    for label, key in (("started", "started_at"), ("finished", "finished_at")):
        if job.get(key):
            rows.append((label, _when(job[key])))
    if job.get("held"):
        rows.append(("held", "yes (cosched release to let it start)"))
    if job.get("user_paused"):
        rows.append(("paused by", "a person (cosched resume to continue)"))
    if job.get("dependencies"):
        deps = ",".join(f"{d['type']}:{d['job']}" for d in job["dependencies"])
        rows.append(("depends on", deps))
    if job.get("array_job_id") is not None:
        limit = f", at most {job['array_limit']} at once" if job.get("array_limit") else ""
        rows.append(("array", f"task {job.get('array_index')} of {job['array_job_id']}{limit}"))
    if job.get("exit_code") is not None:
        rows.append(("exit code", job["exit_code"]))
    if job.get("failure_reason"):
        rows.append(("failure", job["failure_reason"]))
    if job.get("elastic_min_workers") is not None:
        rows.append(("elastic", _elastic_text(job)))
    placement = job.get("placement")
    if placement:
        indices = ",".join(str(g) for g in placement.get("gpus") or [])
        mode = placement.get("sharing_mode", "")
        if placement.get("mps_percentage"):
            mode += f" {placement['mps_percentage']}%"
        if placement.get("mig_profile"):
            mode += f" {placement['mig_profile']}"
        label = "placement" if placement.get("active", True) else "ran on"
        where = f"gpu {indices} ({mode.strip()})" if indices else "(CPU)"
        rows.append((label, f"{placement.get('node')} {where}"))
        rows.append(("policy", placement.get("policy")))
        if placement.get("explanation"):
            rows.append(("why", placement["explanation"]))
    return [f"{label:<11} {value}" for label, value in rows]


def _elastic_text(job: dict[str, Any]) -> str:
    """``1..4 workers, now 3 (attempt 4); 3 changes, last: 4 -> 3 workers (S=0.05): applied``."""
    text = f"{job['elastic_min_workers']}..{job.get('elastic_max_workers')} workers"
    current = [a for a in job.get("attempts") or [] if a.get("active")]
    if current:
        text += f", now {len(current[0].get('gpus') or [])} (attempt {current[0].get('attempt')})"
    changes = job.get("elastic_changes") or []
    if changes:
        last = changes[-1]
        what = last.get("summary") or "a change"  # ElasticChange.summary(), as the page shows
        if last.get("applied"):
            status = "applied"
        elif last.get("refused"):
            status = f"not applied: {last['refused']}"
        else:
            status = "proposed"
        text += f"; {len(changes)} change{'s' * (len(changes) != 1)}, last: {what}: {status}"
    return text


def _limit_text(job: dict[str, Any]) -> str:
    """``00:30:00 per attempt`` (an elastic job's regrouped attempts are one run)."""
    from scheduler.durations import format_duration

    per = "per attempt, regroups included" if job.get("elastic_min_workers") else "per attempt"
    try:
        return f"{format_duration(float(job['time_limit']))} {per}"
    except (TypeError, ValueError):
        return str(job["time_limit"])


def _profile_text(job: dict[str, Any]) -> str:
    if job.get("profile") is None:
        return "-"
    name = job.get("profile_name")
    return f"{name} (id {job['profile']})" if name else str(job["profile"])


def _table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def _shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    if width <= 0 or len(text) <= width:
        return text
    return text[: max(1, width - 1)] + "…"


def _emit_json(data: Any, out: IO[str]) -> None:
    out.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


# -- commands ---------------------------------------------------------------------------------


def _job_path(job_id: int) -> str:
    return f"/api/v1/jobs/{job_id}/"


def _not_found(job_id: int) -> str:
    return f"job {job_id} not found (it does not exist, or it is not yours)"


def _submit_bulk(
    client: Client, args: argparse.Namespace, jobs: Any, raw: bytes, out: IO[str]
) -> int:
    """A job file of the form ``jobs: [job, ...]``: one request, all or nothing."""
    if not isinstance(jobs, list) or not jobs or not all(isinstance(j, dict) for j in jobs):
        raise CliError(
            f"{args.jobfile}: 'jobs' must be a list of job mappings (at most 1000)",
            EXIT_BAD_INPUT,
        )
    if args.wait:
        raise CliError("--wait takes one job; a file of several jobs is submitted without it",
                       EXIT_BAD_INPUT)  # fmt: skip
    headers: dict[str, str] = {}
    key = (
        None if args.no_idempotency_key else (args.idempotency_key or default_idempotency_key(raw))
    )
    if key:
        headers["Idempotency-Key"] = key
    status, body = client.request(
        "POST", "/api/v1/jobs/bulk/", body={"jobs": jobs}, headers=headers, retry=bool(key)
    )
    if args.json:
        _emit_json(body, out)
    elif args.quiet:
        out.write("".join(f"{j['id']}\n" for j in body["jobs"]))
    else:
        ids = [j["id"] for j in body["jobs"]]
        if status == 201:
            out.write(f"Submitted {len(ids)} jobs: {ids[0]}..{ids[-1]}\n")
        else:
            out.write(
                f"These {len(ids)} jobs ({ids[0]}..{ids[-1]}) were already submitted with this "
                "idempotency key. Use --idempotency-key or --no-idempotency-key for new ones.\n"
            )
    out.flush()
    return EXIT_OK


def cmd_submit(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    fields, raw = load_job_file(args.jobfile)
    if set(fields) == {"jobs"}:
        return _submit_bulk(client, args, fields["jobs"], raw, out)
    if getattr(args, "time_limit", None) is not None:
        fields["time_limit"] = args.time_limit
        raw += f"\n# --time-limit {args.time_limit}".encode()  # another limit, another job
    if getattr(args, "project", None):
        fields["project"] = args.project
        raw += b"\nproject: " + args.project.encode()  # a new project is a new job
    # Job control options override the file's (and, being part of the body, its key).
    for option, field in (
        ("array", "array"),
        ("dependency", "dependencies"),
        ("output", "output"),
        ("error", "error"),
    ):
        value = getattr(args, option, None)
        if value:
            fields[field] = value
            raw += f"\n# --{option} {value}".encode()
    if getattr(args, "hold", False):
        fields["held"] = True
        raw += b"\n# --hold"
    for flag, name in (("sharing", "sharing"), ("device", "device"), ("memory", "memory_mb")):
        value = getattr(args, flag, None)
        if value is not None:  # overrides the file's field; another request, another job
            fields[name] = value
            raw += f"\n{name}: {value}".encode()
    headers: dict[str, str] = {}
    key = (
        None if args.no_idempotency_key else (args.idempotency_key or default_idempotency_key(raw))
    )
    if key:
        headers["Idempotency-Key"] = key
    status, job = client.request(
        "POST", "/api/v1/jobs/", body=fields, headers=headers, retry=bool(key)
    )
    if args.json and not args.wait:
        _emit_json(job, out)
    elif args.quiet:
        out.write(f"{job['id']}\n")
    elif not args.json:
        if status == 201 and job.get("array_job_id") is not None:
            out.write(
                f"Submitted array {job['id']} ({job['name']}): {fields['array']}; "
                f"tasks: cosched jobs --array {job['id']}\n"
            )
        elif status == 201:
            out.write(f"Submitted job {job['id']} ({job['name']}): {job['state']}\n")
        else:
            out.write(
                f"Job {job['id']} ({job['name']}) was already submitted with this idempotency "
                f"key; it is {job['state']}. Use --idempotency-key or --no-idempotency-key "
                "for a new job.\n"
            )
        if job.get("waiting_reason"):
            out.write(f"  note: {job['waiting_reason']}\n")
        out.write(f"  {client.url}/jobs/{job['id']}/\n")
    out.flush()
    if not args.wait:
        return EXIT_OK
    args.id = job["id"]
    return cmd_wait(client, args, out, err)


def cmd_status(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    _, job = client.request("GET", _job_path(args.id), not_found=_not_found(args.id))
    if args.json:
        _emit_json(job, out)
    else:
        out.write("\n".join(_job_lines(job)) + "\n")
    return EXIT_OK


def _state_line(job_id: int, job: dict[str, Any], waited: float) -> str:
    line = f"job {job_id}: {job.get('state')} after {_duration(waited)}"
    if job.get("state") == "PENDING" and job.get("waiting_reason"):
        line += f" (waiting: {job['waiting_reason']})"
    return line


def cmd_wait(
    client: Client,
    args: argparse.Namespace,
    out: IO[str],
    err: IO[str],
    *,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Poll until the job ends. On a terminal: one progress line (spinner, state, elapsed time,
    the waiting reason) redrawn in place. Piped: one plain line per change of state or reason,
    with the time waited so far."""
    started = clock()
    spinner = itertools.cycle("|/-\\")
    live = err.isatty()
    width = shutil.get_terminal_size((100, 20)).columns
    last_seen: tuple[Any, Any] | None = None
    try:
        while True:
            _, job = client.request("GET", _job_path(args.id), not_found=_not_found(args.id))
            state = job.get("state")
            waited = clock() - started
            seen = (state, job.get("waiting_reason"))
            if live:
                if last_seen is not None and seen[0] != last_seen[0]:
                    err.write("\r\033[K" + _state_line(args.id, job, waited) + "\n")
                line = f"{next(spinner)} job {args.id} {state}  {_duration(waited)}"
                if state == "PENDING" and job.get("waiting_reason"):
                    line += f"  {job['waiting_reason']}"
                err.write("\r\033[K" + line[: max(20, width - 1)])
                err.flush()
            elif seen != last_seen:
                err.write(_state_line(args.id, job, waited) + "\n")
                err.flush()
            last_seen = seen
            if state in TERMINAL_STATES:
                break
            if args.timeout is not None and waited >= args.timeout:
                if live:
                    err.write("\r\033[K")
                raise CliError(
                    f"gave up after {_duration(waited)}: job {args.id} is still {state}",
                    EXIT_TIMEOUT,
                )
            pause = args.interval
            if args.timeout is not None:
                pause = max(0.0, min(pause, args.timeout - waited))
            client.sleep(pause)
    except KeyboardInterrupt:
        if live:
            err.write("\r\033[K")
        err.write(f"cosched: stopped waiting; job {args.id} was not cancelled\n")
        return EXIT_INTERRUPTED
    if live:
        err.write("\r\033[K")
        err.flush()
    if args.json:
        _emit_json(job, out)
    elif state == "COMPLETED":
        out.write(f"Job {args.id} COMPLETED (exit code {job.get('exit_code', 0)})\n")
    else:
        detail = []
        if job.get("exit_code") is not None:
            detail.append(f"exit code {job['exit_code']}")
        if job.get("failure_reason"):
            detail.append(job["failure_reason"])
        label = f"{state} ({job['end_label']})" if job.get("end_label") else state
        out.write(f"Job {args.id} {label}" + (f": {'; '.join(detail)}" if detail else "") + "\n")
    return EXIT_OK if state == "COMPLETED" else EXIT_JOB_NOT_COMPLETED


def new_log_text(before: str, now: str) -> str:
    """What ``now`` (a log tail) adds to ``before`` (the tail printed last time). The tail is a
    window that slides: find where the end of ``before`` sits in ``now``; when it is gone (more
    output than one tail holds came in between), say that some lines were skipped."""
    if not before:
        return now
    if now.startswith(before):
        return now[len(before) :]
    for size in (1024, 256, 64):
        anchor = before[-size:]
        if len(anchor) < min(size, len(before)):
            continue
        at = now.rfind(anchor)
        if at >= 0:
            return now[at + len(anchor) :]
    if now == before[-len(now) :]:
        return ""
    return "[... output skipped: more than one log tail came in between polls ...]\n" + now


def cmd_logs(
    client: Client,
    args: argparse.Namespace,
    out: IO[str],
    err: IO[str],
) -> int:
    """Print the tail of a job's log (what its node agent last pushed); ``-f`` follows it until
    the job ends; ``--all``: the whole log the portal keeps, every attempt."""
    if getattr(args, "all", False):
        path = _job_path(args.id) + "log/full/"
        params = {"attempt": args.attempt} if getattr(args, "attempt", None) else None
        _, text = client.request(
            "GET", path, params=params, raw=True, not_found=_not_found(args.id)
        )
        if not text:
            err.write(f"job {args.id}: no output kept yet\n")
        out.write(text)
        out.flush()
        return EXIT_OK
    printed = ""
    while True:
        _, body = client.request("GET", _job_path(args.id) + "log/", not_found=_not_found(args.id))
        text = body.get("text") or ""
        if args.json:
            _emit_json(body, out)
            return EXIT_OK
        chunk = new_log_text(printed, text)
        if chunk:
            out.write(chunk)
            out.flush()
        printed = text or printed
        state = body.get("state")
        if not args.follow or state in TERMINAL_STATES:
            if not printed and not args.follow:
                err.write(f"job {args.id} ({state}): no output yet\n")
            if args.follow:
                if printed and not printed.endswith("\n"):
                    out.write("\n")
                err.write(f"job {args.id} {state}\n")
            return EXIT_OK
        try:
            client.sleep(args.interval)
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED


def cmd_cancel(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    _, job = client.request(
        "POST", _job_path(args.id) + "cancel/", retry=True, not_found=_not_found(args.id)
    )
    if args.json:
        _emit_json(job, out)
    else:
        out.write(f"Cancelled job {job['id']} ({job.get('name', '')}): {job['state']}\n")
    return EXIT_OK


def _post_verb(verb: str, past: str) -> Callable[..., int]:
    def command(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
        _, job = client.request(
            "POST", _job_path(args.id) + f"{verb}/", retry=True, not_found=_not_found(args.id)
        )
        if args.json:
            _emit_json(job, out)
        else:
            out.write(f"{past} job {job['id']} ({job.get('name', '')}): {job['state']}\n")
        return EXIT_OK

    command.__name__ = f"cmd_{verb}"
    return command


cmd_hold = _post_verb("hold", "Held")
cmd_release = _post_verb("release", "Released")
cmd_requeue = _post_verb("requeue", "Requeued")
cmd_pause = _post_verb("pause", "Paused")
cmd_resume = _post_verb("resume", "Resumed")


def cmd_update(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """Change a pending job: only the options given are sent."""
    body: dict[str, Any] = {}
    for option, field in (
        ("gpus", "gpus"),
        ("gpu_memory_mb", "gpu_memory_mb"),
        ("cpus", "cpus"),
        ("memory_mb", "memory_mb"),
        ("time_limit", "time_limit"),
        ("priority", "priority"),
        ("dependency", "dependencies"),
    ):
        value = getattr(args, option, None)
        if value is not None:
            body[field] = value
    if not body:
        raise CliError(
            "nothing to change: give at least one option (cosched update -h)", EXIT_BAD_INPUT
        )
    _, job = client.request("PATCH", _job_path(args.id), body=body, not_found=_not_found(args.id))
    if args.json:
        _emit_json(job, out)
    else:
        said = ", ".join(f"{k} {v}" for k, v in body.items())
        out.write(f"Updated job {job['id']} ({job.get('name', '')}): {said}\n")


def cmd_profile(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """Staff: short solo (and pair) runs of an application, measured into a draft profile."""
    body: dict[str, Any] = {
        "profile": args.app,
        "models": [m.strip() for m in args.models.split(",") if m.strip()],
    }
    if args.with_app:
        body["with_profile"] = args.with_app
    if args.command:
        body["command"] = args.command
    if args.scale is not None:
        body["scale"] = args.scale
    _, answer = client.request("POST", "/api/v1/profiling/", body=body)
    if args.json:
        _emit_json(answer, out)
        return EXIT_OK
    out.write(f"Profiling run {answer['run']}: {len(answer['jobs'])} jobs\n")
    for job in answer["jobs"]:
        out.write(f"  #{job['id']} {job['name']} ({job['state']})\n")
    out.write(
        "Their measurements go into the profile's measured draft (staff review it on the "
        "profile page; GET /api/v1/profiling/?profile=NAME shows it).\n"
    )
    return EXIT_OK


def cmd_jobs(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    params: dict[str, Any] = {"page_size": min(args.limit, 500)}
    if args.state:
        params["state"] = args.state.upper()
    if args.search:
        params["search"] = args.search
    if getattr(args, "array", None):
        params["array"] = args.array
    _, data = client.request("GET", "/api/v1/jobs/", params=params)
    jobs = data.get("results", []) if isinstance(data, dict) else data
    jobs = jobs[: args.limit]
    total = data.get("count", len(jobs)) if isinstance(data, dict) else len(jobs)
    if args.json:
        _emit_json(jobs, out)
        return EXIT_OK
    if not jobs:
        out.write("No jobs" + (f" in state {args.state.upper()}" if args.state else "") + ".\n")
        return EXIT_OK
    show_owner = len({job.get("owner") for job in jobs}) > 1
    show_project = len({job.get("project") for job in jobs}) > 1
    show_reason = any(job.get("waiting_reason") for job in jobs)
    headers = [
        "ID",
        "STATE",
        "KIND",
        "GPUS",
        "SUBMITTED",
        *(["OWNER"] if show_owner else []),
        *(["PROJECT"] if show_project else []),
        "NAME",
        *(["WAITING BECAUSE"] if show_reason else []),
    ]
    rows = [
        [
            job["id"] if job.get("array_index") is None else f"{job['id']} [{job['array_index']}]",
            job["state"],
            job.get("kind", ""),
            job.get("gpus", ""),
            _when(job.get("submitted_at"))[:16],
            *([job.get("owner", "")] if show_owner else []),
            *([job.get("project") or ""] if show_project else []),
            job.get("name", ""),
            *(
                [_shorten(job.get("waiting_reason") or "", args.reason_width)]
                if show_reason
                else []
            ),
        ]
        for job in jobs
    ]
    out.write(_table(rows, headers) + "\n")
    if total > len(jobs):
        err.write(f"({len(jobs)} of {total} jobs shown; use --limit or --state)\n")
    return EXIT_OK


def _node_operation(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    """``cosched nodes drain|down|resume NAME [--reason R]`` (staff), like ``scontrol update
    nodename=NAME state=drain reason=R``."""
    if not args.node:
        raise CliError(f"name the node: cosched nodes {args.action} NAME", EXIT_BAD_INPUT)
    if args.action in ("drain", "down") and not (args.reason or "").strip():
        raise CliError(
            f"say why: cosched nodes {args.action} {args.node} --reason 'replacing a fan'",
            EXIT_BAD_INPUT,
        )
    body = {"reason": args.reason} if args.reason else {}
    path = f"/api/v1/nodes/{urllib.parse.quote(args.node, safe='')}/{args.action}/"
    _, data = client.request("POST", path, body=body, not_found=f"no node {args.node!r}")
    if args.json:
        _emit_json(data, out)
        return EXIT_OK
    node = data.get("node", data) if isinstance(data, dict) else {}
    state = node.get("state") or node.get("status", "")
    if args.action == "down":
        requeued = data.get("requeued") or []
        jobs = ", ".join(str(j) for j in requeued) or "none"
        out.write(f"Node {args.node}: {state}; jobs requeued: {jobs}\n")
    elif args.action == "drain":
        out.write(f"Node {args.node}: {state} (running jobs finish, no new ones start)\n")
    else:
        out.write(f"Node {args.node}: {state}\n")


def cmd_history(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """Finished jobs, as ``sacct`` lists them: elapsed, queue wait, GPU-hours, exit code,
    reason and nodes, over a time window and filters."""
    params: dict[str, Any] = {"page_size": min(args.limit, 500), "finished_since": args.since}
    if args.until:
        params["finished_until"] = args.until
    if args.state:
        params["state"] = args.state.upper()
    for name in ("user", "project"):
        if getattr(args, name):
            params[name] = getattr(args, name)
    _, data = client.request("GET", "/api/v1/jobs/", params=params)
    jobs = data.get("results", []) if isinstance(data, dict) else data
    jobs = jobs[: args.limit]
    total = data.get("count", len(jobs)) if isinstance(data, dict) else len(jobs)
    if args.json:
        _emit_json(jobs, out)
        return EXIT_OK
    if not jobs:
        out.write(f"No job finished since {args.since}.\n")
        return EXIT_OK
    headers = ["ID", "NAME", "USER", "STATE", "EXIT", "ELAPSED", "WAIT", "GPU-H", "NODES"]
    headers.append("REASON")
    rows = []
    for job in jobs:
        elapsed = job.get("elapsed_s")
        rows.append(
            [
                job["id"],
                _shorten(job.get("name", ""), 30),
                job.get("owner", ""),
                job["state"],
                "-" if job.get("exit_code") is None else job["exit_code"],
                "-" if elapsed is None else _duration(elapsed),
                _duration(job.get("queue_wait_s") or 0),
                f"{job.get('gpu_hours') or 0:.2f}",
                ",".join(job.get("nodes") or []) or "-",
                _shorten(job.get("failure_reason") or job.get("end_label") or "", 50),
            ]
        )
    out.write(_table(rows, headers) + "\n")
    if total > len(jobs):
        err.write(f"({len(jobs)} of {total} jobs shown; use --limit or a shorter window)\n")
    return EXIT_OK


def cmd_nodes(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """The cluster's nodes, as ``sinfo`` lists a Slurm partition; staff also see how each node
    keeps its jobs apart (``NodeInfo.isolation``). ``drain``, ``down`` and ``resume`` change
    one node (staff)."""
    if getattr(args, "action", "list") != "list":
        return _node_operation(client, args, out)
    nodes: list[dict[str, Any]] = []
    page = 1
    while True:
        _, data = client.request("GET", "/api/v1/nodes/", params={"page_size": 500, "page": page})
        nodes.extend(data.get("results", []) if isinstance(data, dict) else data)
        if not isinstance(data, dict) or not data.get("next"):
            break
        page += 1
    if args.json:
        _emit_json(nodes, out)
        return EXIT_OK
    if not nodes:
        out.write("No nodes: a node appears when its agent first syncs (docs/nodes.md).\n")
        return EXIT_OK
    staff = any(node.get("isolation") is not None for node in nodes)
    headers = ["NODE", "STATUS", "KIND", "GPUS", "CORES", "MEMORY", "CONTAINERS", "HEARTBEAT"]
    rows = []
    for node in nodes:
        models: dict[str, int] = {}
        for gpu in node.get("gpus") or []:
            models[gpu.get("model", "?")] = models.get(gpu.get("model", "?"), 0) + 1
        gpus = ", ".join(f"{n} {m}" for m, n in models.items()) or "-"
        memory = node.get("memory_mb") or 0
        row = [
            node.get("name", ""),
            node.get("state") or node.get("status", ""),
            node.get("kind", ""),
            gpus,
            node.get("cores", ""),
            f"{memory / 1024:.0f} GB" if memory else "-",
            ",".join(node.get("container_runtimes") or ()) or "-",
            _when(node["last_heartbeat"])[:16] if node.get("last_heartbeat") else "never",
        ]
        if staff:
            row.append(_isolation_text(node.get("isolation")))
        rows.append(row)
    extra = ["ISOLATION"] if staff else []
    if any(node.get("state_reason") for node in nodes):  # drained or down by staff: say why
        extra.append("REASON")
        for row, node in zip(rows, nodes, strict=True):
            row.append(node.get("state_reason") or "")
    out.write(_table(rows, headers + extra) + "\n")
    return EXIT_OK


def _isolation_text(aspects: Any) -> str:
    """``ok``, ``weak: accounts, limits`` or ``not reported`` (an agent that does not say)."""
    from workers.protocol import ISOLATION_ASPECTS as labels

    if not aspects:
        return "not reported"
    weak = [labels.get(a.get("what"), a.get("what")) for a in aspects if a.get("level") == "weak"]
    return "weak: " + ", ".join(weak) if weak else "ok"


def cmd_projects(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    _, rows = client.request("GET", "/api/v1/projects/")
    if args.json:
        _emit_json(rows, out)
        return EXIT_OK
    if not rows:
        out.write("No projects yet: your first job creates your personal project.\n")
        return EXIT_OK
    table = []
    for row in rows:
        quotas = ", ".join(
            f"{q['gpu_model']} {q['in_use_gpus']}/{q['guaranteed_gpus']}"
            f"+{'any' if q['borrow_limit_gpus'] is None else q['borrow_limit_gpus']}"
            for q in row.get("quotas", [])
        )
        table.append(
            [
                row["project"] + (" *" if row.get("is_default") else ""),
                row["role"],
                quotas or "-",
                f"{row['my_usage_gpu_hours']:.2f}",
                f"{row['factor']:.3f}",
            ]
        )
    headers = ["PROJECT", "ROLE", "QUOTAS (IN USE/GUARANTEED+BORROW)", "MY GPU-H", "FAIR SHARE"]
    out.write(_table(table, headers) + "\n")
    out.write("* your default project; GPU-hours decayed by the fair-share half-life\n")
    return EXIT_OK


def cmd_usage(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    params: dict[str, Any] = {"since": args.since, "by": args.by}
    if args.until:
        params["until"] = args.until
    try:
        _, data = client.request("GET", "/api/v1/usage/", params=params)
    except CliError as exc:  # a 400 names the bad options, not a job
        raise CliError(
            str(exc).replace("rejected the job:", "rejected the options:"), exc.exit_code
        ) from None
    if args.json:
        _emit_json(data, out)
        return EXIT_OK
    rows = data.get("rows", [])
    if args.csv:
        import csv

        models = sorted({m for row in rows for m in row.get("gpu_seconds_by_model", {})})
        writer = csv.writer(out, lineterminator="\n")
        columns = ["jobs", "gpu_seconds", "cpu_seconds", "wait_seconds", "mean_wait_seconds"]
        writer.writerow([args.by, *columns, *(f"gpu_seconds_{m}" for m in models)])
        for row in rows:
            writer.writerow(
                [
                    row["group"],
                    *(round(row[c], 3) for c in columns),
                    *(round(row["gpu_seconds_by_model"].get(m, 0.0), 3) for m in models),
                ]
            )
        return EXIT_OK
    out.write(f"Usage {_when(data.get('since'))[:16]} to {_when(data.get('until'))[:16]} UTC\n")
    if not rows:
        out.write("No jobs in this window.\n")
        return EXIT_OK
    models = sorted({m for row in rows for m in row.get("gpu_seconds_by_model", {})})
    headers = [args.by.upper(), "JOBS", "GPU-H", *(f"{m}-H" for m in models), "CPU-H", "WAIT-H"]
    table = [
        [
            row["group"],
            row["jobs"],
            f"{row['gpu_seconds'] / 3600:.2f}",
            *(f"{row['gpu_seconds_by_model'].get(m, 0.0) / 3600:.2f}" for m in models),
            f"{row['cpu_seconds'] / 3600:.2f}",
            f"{row['wait_seconds'] / 3600:.2f}",
        ]
        for row in rows
    ]
    total = data.get("total", {})
    table.append(
        [
            "TOTAL",
            total.get("jobs", 0),
            f"{total.get('gpu_seconds', 0.0) / 3600:.2f}",
            *(f"{total.get('gpu_seconds_by_model', {}).get(m, 0.0) / 3600:.2f}" for m in models),
            f"{total.get('cpu_seconds', 0.0) / 3600:.2f}",
            f"{total.get('wait_seconds', 0.0) / 3600:.2f}",
        ]
    )
    out.write(_table(table, headers) + "\n")
    return EXIT_OK


# -- entry point ------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a job id: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"not a job id: {text!r}")
    return value


def _time_limit(text: str) -> int:
    """``--time-limit``: checked here with the server's own parser (``scheduler.durations``)."""
    from scheduler.durations import DurationError, parse_duration

    try:
        return parse_duration(text)
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _memory_mb(text: str) -> int:
    """Host memory as sbatch's --mem takes it: MB, or a number with K, M, G or T."""
    units = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    raw = text.strip().upper().removesuffix("B")
    scale = 1.0
    if raw and raw[-1] in units:
        scale, raw = units[raw[-1]], raw[:-1]
    try:
        value = float(raw) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a memory size: {text!r} (e.g. 16G)") from None
    if not 1 <= value < 2**53:
        raise argparse.ArgumentTypeError(f"must be at least 1 MB: {text!r}")
    return int(-(-value // 1))


JOB_FILE_HELP = """\
job file (YAML, or JSON when the name ends in .json; - reads standard input):

  name: resnet50-nightly          # required, at most 200 characters
  command: python train.py -e 3   # run by /bin/sh -c on the node (or give container_image)
  profile: ResNet-50              # optional: an approved profile's id, name or name:version;
                                  #   blank resources below then come from it
  gpus: 1                         # 0 = CPU-only job (default 0)
  gpu_memory_mb: 8000             # per GPU (default: the profile's maximum)
  cpus: 4                         # cores (default 1)
  memory_mb: 16000                # host memory, reserved on the node and enforced (optional)
  sharing: never                  # never (GPUs of its own; the usual site default), allowed,
                                  #   mps, time_slicing or a MIG profile such as 1g.6gb
  device: gpu                     # gpu (GPUs only), auto (the policy may pick a CPU node for
                                  #   a one-GPU job) or cpu (a CPU-only job, gpus: 0)
  kind: dl-train                  # dl-train, dl-infer, hpc or other (default: the profile's)
  priority: 0                     # -1000..1000, higher first under priority-aware policies
  time_limit: 2h                  # per attempt: 90s, 30m, 2h, 1-00:00:00 or seconds; past it
                                  #   the job is stopped and ends FAILED (time limit)
  params: {batch_size: 64}        # free-form parameters (a mapping)
  container_image: ""             # optional
  elastic_min_workers: 1          # optional, elastic training
  elastic_max_workers: 4
  elastic_value_per_hour: 2.0     # optional: an hour sooner is worth 2 GPU-hours
  # elastic_deadline_s: 7200      #   ... or: finish within 2 h of the start (not both)
  max_global_batch: 1024          # optional: the largest global batch
  project: vision-lab             # optional: a project you belong to (default: yours)
  dependencies: afterok:812       # optional: start after jobs of yours (after, afternotok,
                                  #   afterany too; comma-separated)
  array: 0-99%8                   # optional: 100 tasks, at most 8 at once
  held: false                     # optional: true = does not start until released
  output: logs/%j_%a.out          # optional: output file (%j job, %a array index, %u user)
  error: logs/%j_%a.err           # optional: standard error file (default: with the output)

Unknown fields are refused (a typo is not ignored). A job that can never run on the cluster
(more GPUs of one model than exist, more GPU memory than any GPU, more cores than any node) is
refused with the largest request that would fit. The full reference is the docs site's
"Command line" page.
"""


def build_parser() -> argparse.ArgumentParser:
    # Common options work before or after the subcommand (SUPPRESS keeps the first one given).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url", default=argparse.SUPPRESS, help=f"server URL (COSCHED_URL, default {DEFAULT_URL})"
    )
    common.add_argument("--token", default=argparse.SUPPRESS, help="API token (COSCHED_TOKEN)")
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON for scripts"
    )
    common.add_argument(
        "--retries",
        type=int,
        default=argparse.SUPPRESS,
        help="retries of safe requests on connection errors and 502/503/504 (default 2)",
    )

    parser = argparse.ArgumentParser(
        prog="cosched",
        parents=[common],
        description="Submit and follow jobs on a Cosched cluster.",
        epilog=(
            "exit codes: 0 ok (wait: COMPLETED), 1 job FAILED/CANCELLED, 2 bad input, "
            "3 auth, 4 not found, 5 server unreachable or failing, 6 wait timed out"
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add_wait_options(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--timeout", type=_seconds, help="give up waiting after this many seconds (exit 6)"
        )
        p.add_argument(
            "--interval", type=_seconds, default=3.0, help="seconds between polls (default 3)"
        )

    p = sub.add_parser(
        "submit",
        parents=[common],
        help="submit a job file (YAML or JSON)",
        description="Submit a job file; prints the job id and state.",
        epilog=JOB_FILE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("jobfile", help="path to the job file, or - for standard input")
    keys = p.add_mutually_exclusive_group()
    keys.add_argument(
        "--idempotency-key",
        help="retry-safety key (default: derived from the file's content, so a retried CI "
        "step with the same file returns the same job)",
    )
    keys.add_argument("--no-idempotency-key", action="store_true", help="always create a new job")
    p.add_argument(
        "--project", help="the project (team) to submit to (default: the file's, else yours)"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print only the job id")
    p.add_argument(
        "--sharing",
        help="never (GPUs of its own), allowed, mps, time_slicing or a MIG profile; overrides "
        "the file's sharing (default: the site's, usually never)",
    )
    p.add_argument(
        "--device",
        choices=["gpu", "auto", "cpu"],
        help="gpu: GPUs only; auto: the policy may run a one-GPU job on a CPU node; cpu: "
        "CPU only; overrides the file's device",
    )
    p.add_argument(
        "--memory",
        type=_memory_mb,
        metavar="SIZE",
        help="host memory: MB, or with a unit (512M, 16G, 1T); overrides the file's memory_mb",
    )
    p.add_argument(
        "--time-limit",
        type=_time_limit,
        metavar="DURATION",
        help="time limit per attempt (90s, 30m, 2h, 1-00:00:00 or seconds); overrides the job "
        "file's time_limit",
    )
    p.add_argument(
        "--array",
        metavar="INDICES",
        help='submit an array: "0-99%%8" (tasks 0..99, at most 8 at once), "1,3,5-7", "0-15:4"',
    )
    p.add_argument(
        "--dependency",
        "-d",
        metavar="LIST",
        help="wait for jobs of yours: afterok:812, after:812, afternotok:812, afterany:812, "
        "comma-separated",
    )
    p.add_argument("--hold", action="store_true", help="submit held (cosched release starts it)")
    p.add_argument("--output", "-o", help="output file: %%j job id, %%a array index, %%u user")
    p.add_argument("--error", "-e", help="standard error file (same patterns; default: output)")
    p.add_argument(
        "--wait",
        action="store_true",
        help="then wait for the job to finish, like `cosched wait` (exit 0 only if COMPLETED)",
    )
    add_wait_options(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("status", parents=[common], help="show one job")
    p.add_argument("id", type=_positive_int)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "wait",
        parents=[common],
        help="wait for a job to finish (exit 0 only if COMPLETED)",
        description=(
            "Wait for a job to finish. On a terminal a progress line shows the state, the time "
            "waited and why a pending job waits; piped, one line per change."
        ),
    )
    p.add_argument("id", type=_positive_int)
    add_wait_options(p)
    p.set_defaults(func=cmd_wait)

    p = sub.add_parser(
        "logs",
        parents=[common],
        help="print the tail of a job's log (-f: follow until the job ends)",
        description=(
            "Print the last 16 KB of a job's output, as its node agent last reported it. "
            "With -f, keep printing new output until the job finishes."
        ),
    )
    p.add_argument("id", type=_positive_int)
    p.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    p.add_argument(
        "--all",
        action="store_true",
        help="the whole log the portal keeps (every attempt), not only the last 16 KB",
    )
    p.add_argument("--attempt", type=_positive_int, help="with --all: only this attempt")
    p.add_argument(
        "--interval", type=_seconds, default=2.0, help="seconds between polls (default 2)"
    )
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser(
        "profile",
        parents=[common],
        help="staff: profile an application on the cluster (short solo and pair runs)",
    )
    p.add_argument("app", help="the application's profile (id, name or name:version)")
    p.add_argument("--models", required=True, help="GPU models, comma-separated: H100,A30")
    p.add_argument("--with", dest="with_app", help="another application to pair it with")
    p.add_argument("--command", help="the application's command (default: its emulator)")
    p.add_argument("--scale", type=float, help="emulated runs: profile time x this")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("cancel", parents=[common], help="cancel a job that has not finished")
    p.add_argument("id", type=_positive_int)
    p.set_defaults(func=cmd_cancel)

    for name, func, text in (
        ("hold", cmd_hold, "hold a pending job: it does not start until released"),
        ("release", cmd_release, "release a held job"),
        ("requeue", cmd_requeue, "stop a placed job and put it back in the queue"),
        ("pause", cmd_pause, "pause a running job (it stays paused until you resume it)"),
        ("resume", cmd_resume, "resume a job you paused"),
    ):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("id", type=_positive_int)
        p.set_defaults(func=func)

    p = sub.add_parser(
        "update",
        parents=[common],
        help="change a pending job's resources, time limit, priority or dependencies",
    )
    p.add_argument("id", type=_positive_int)
    p.add_argument("--gpus", type=int)
    p.add_argument("--gpu-memory-mb", type=int, dest="gpu_memory_mb")
    p.add_argument("--cpus", type=int)
    p.add_argument("--memory-mb", type=int, dest="memory_mb")
    p.add_argument("--time-limit", type=_time_limit, metavar="DURATION", dest="time_limit")
    p.add_argument("--priority", type=int)
    p.add_argument(
        "--dependency", "-d", metavar="LIST", help='e.g. "afterok:812"; "" removes them all'
    )
    p.set_defaults(func=cmd_update)

    p = sub.add_parser("jobs", parents=[common], help="list your jobs (staff: all jobs)")
    p.add_argument("--array", type=_positive_int, help="the tasks of this array, by index")
    p.add_argument("--state", help="state(s), comma-separated, e.g. PENDING,RUNNING")
    p.add_argument("--search", help="substring of the job name")
    p.add_argument("--limit", type=int, default=50, help="at most this many jobs (default 50)")
    p.add_argument(
        "--reason-width",
        type=int,
        default=70,
        help="cut waiting reasons to this many characters (0: whole; default 70)",
    )
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser(
        "history",
        parents=[common],
        help="finished jobs, like sacct: elapsed, wait, GPU-hours, exit code, reason, nodes",
        description="Jobs that finished in a window (yours and your projects'; staff: all).",
    )
    p.add_argument("--since", default="1d", help="7d, 24h, 30m, 2w or a date (default 1d)")
    p.add_argument("--until", help="same forms (default: now)")
    p.add_argument("--state", help="state(s), comma-separated, e.g. FAILED,CANCELLED")
    p.add_argument("--user", help="only this user's jobs")
    p.add_argument("--project", help="only this project's jobs")
    p.add_argument("--limit", type=int, default=100, help="at most this many jobs (default 100)")
    p.set_defaults(func=cmd_history)

    p = sub.add_parser(
        "nodes",
        parents=[common],
        help="the cluster's nodes: status, GPUs, cores (staff: how each keeps jobs apart); "
        "staff: drain, down or resume one",
    )
    p.add_argument(
        "action",
        nargs="?",
        choices=["list", "drain", "down", "resume"],
        default="list",
        help="list (default); drain NAME: finish its jobs, start none; down NAME: requeue its "
        "jobs now; resume NAME: back in service",
    )
    p.add_argument("node", nargs="?", help="the node's name (drain, down, resume)")
    p.add_argument("--reason", help="why (drain and down need one)")
    p.set_defaults(func=cmd_nodes)

    p = sub.add_parser(
        "projects",
        parents=[common],
        help="your projects: role, GPU quotas and what they hold now, fair share",
    )
    p.set_defaults(func=cmd_projects)

    p = sub.add_parser(
        "usage",
        parents=[common],
        help="GPU-hours, CPU-hours and wait per project, user or job",
        description=(
            "Usage accounting over the jobs you can see (yours and your projects'; staff: all): "
            "GPU-hours by GPU model, CPU core-hours and time queued."
        ),
    )
    p.add_argument("--since", default="30d", help="7d, 24h, 30m, 2w or a date (default 30d)")
    p.add_argument("--until", help="same forms (default: now)")
    p.add_argument("--by", choices=["project", "user", "job"], default="project")
    p.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    p.set_defaults(func=cmd_usage)

    p = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description=(
            'Print a completion script: `eval "$(cosched completion bash)"` in ~/.bashrc, '
            "or `cosched completion zsh > ~/.zfunc/_cosched`."
        ),
    )
    p.add_argument("shell", choices=["bash", "zsh"])
    p.set_defaults(func=cmd_completion, offline=True)
    return parser


def completion_script(shell: str, parser: argparse.ArgumentParser | None = None) -> str:
    """A bash (or zsh, through bashcompinit) completion script for the commands and options of
    ``parser``; written from the parser itself so it never goes stale."""
    parser = parser or build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    cases = []
    for name, command in sub.choices.items():
        options = sorted(
            opt for action in command._actions for opt in action.option_strings if opt != "-h"
        )
        cases.append(f'        {name}) opts="{" ".join(options)}" ;;')
    commands = " ".join(sub.choices)
    body = "\n".join(cases)
    script = f"""# cosched completion ({shell}); generated by `cosched completion {shell}`
_cosched() {{
    local cur cmd opts
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    cmd=""
    for word in "${{COMP_WORDS[@]:1:COMP_CWORD-1}}"; do
        case "$word" in -*) ;; *) cmd="$word"; break ;; esac
    done
    if [ -z "$cmd" ]; then
        COMPREPLY=( $(compgen -W "{commands} --help" -- "$cur") )
        return
    fi
    case "$cmd" in
{body}
        *) opts="" ;;
    esac
    if [ "$cmd" = completion ]; then opts="$opts bash zsh"; fi
    if [ "$cmd" = submit ] && [[ "$cur" != -* ]]; then
        COMPREPLY=( $(compgen -f -- "$cur") $(compgen -W "$opts" -- "$cur") )
    else
        COMPREPLY=( $(compgen -W "$opts" -- "$cur") )
    fi
}}
complete -o filenames -F _cosched cosched
"""
    if shell == "zsh":
        script = "#compdef cosched\nautoload -U +X bashcompinit && bashcompinit\n" + script
    return script


def cmd_completion(client: Any, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    out.write(completion_script(args.shell))
    return EXIT_OK


def _fail(message: str, code: int, err: IO[str]) -> NoReturn:
    err.write(f"cosched: {message}\n")
    raise SystemExit(code)


def main(
    argv: Sequence[str] | None = None,
    *,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """Run the CLI; returns the exit code (see the module docstring)."""
    out = out or sys.stdout
    err = err or sys.stderr
    env = os.environ if env is None else env
    args = build_parser().parse_args(argv)
    args.json = getattr(args, "json", False)
    url = getattr(args, "url", None) or env.get("COSCHED_URL") or DEFAULT_URL
    token = getattr(args, "token", None) or env.get("COSCHED_TOKEN", "")
    if not url.startswith(("http://", "https://")):
        _fail(f"server URL must start with http:// or https://, got {url!r}", EXIT_BAD_INPUT, err)
    client = Client(url, token.strip(), retries=max(0, getattr(args, "retries", 2)))
    try:
        return args.func(client, args, out, err)
    except CliError as exc:
        err.write(f"cosched: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        err.write("cosched: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `cosched jobs | head`
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
