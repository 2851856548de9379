"""``cosched``: submit and follow Cosched jobs from a terminal or a CI pipeline.

A plain HTTP client of the REST API (``requests``); it imports nothing from Django.

    export COSCHED_URL=https://cosched.example.org   # default http://127.0.0.1:8000
    export COSCHED_TOKEN=cos_...                      # account page -> API tokens
    cosched submit job.yaml        # prints the job id and state
    cosched wait 42 --timeout 3600 # exit code 0 only if the job COMPLETED
    cosched status 42 | cosched cancel 42 | cosched jobs --state PENDING,RUNNING

The job file (YAML or JSON) holds the API's job fields: ``name``, ``command``, ``profile`` (an
id, or the name of an approved profile), ``gpus``, ``gpu_memory_mb``, ``cpus``, ``memory_mb``,
``kind``, ``params``, ``priority`` (and ``container_image``, ``elastic_min_workers``,
``elastic_max_workers``).

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
import sys
import time
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
    ) -> tuple[int, Any]:
        """Send one request; returns ``(status, decoded JSON body)`` for a 2xx answer.

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


def resolve_profile(client: Client, fields: dict[str, Any]) -> dict[str, Any]:
    """Replace a profile *name* (``profile: LAMMPS``) by its id; an id passes through."""
    profile = fields.get("profile")
    if not isinstance(profile, str) or profile.strip().isdigit():
        return fields
    name = profile.strip()
    _, data = client.request("GET", "/api/v1/profiles/", params={"search": name, "page_size": 100})
    rows = data.get("results", data) if isinstance(data, dict) else data
    matches = [row for row in rows or [] if str(row.get("name", "")).lower() == name.lower()]
    if not matches:
        raise CliError(f"profile {name!r}: no approved profile has this name", EXIT_BAD_INPUT)
    if len(matches) > 1:
        versions = ", ".join(f"id {row['id']} (v{row.get('version')})" for row in matches)
        raise CliError(
            f"profile {name!r}: several versions ({versions}); give the id", EXIT_BAD_INPUT
        )
    return {**fields, "profile": matches[0]["id"]}


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
        ("owner", job.get("owner")),
        ("kind", job.get("kind")),
        ("profile", job.get("profile") if job.get("profile") is not None else "-"),
        ("gpus", job.get("gpus")),
        ("gpu memory", f"{job['gpu_memory_mb']} MB" if job.get("gpu_memory_mb") else "-"),
        ("cpus", job.get("cpus")),
        ("priority", job.get("priority")),
        ("submitted", _when(job.get("submitted_at"))),
    ]
    for label, key in (("started", "started_at"), ("finished", "finished_at")):
        if job.get(key):
            rows.append((label, _when(job[key])))
    if job.get("exit_code") is not None:
        rows.append(("exit code", job["exit_code"]))
    if job.get("failure_reason"):
        rows.append(("failure", job["failure_reason"]))
    placement = job.get("placement")
    if placement:
        gpus = ",".join(str(g) for g in placement.get("gpus") or []) or "cpu"
        mode = placement.get("sharing_mode", "")
        if placement.get("mps_percentage"):
            mode += f" {placement['mps_percentage']}%"
        if placement.get("mig_profile"):
            mode += f" {placement['mig_profile']}"
        rows.append(("placement", f"{placement.get('node')} gpu {gpus} ({mode.strip()})"))
        rows.append(("policy", placement.get("policy")))
        if placement.get("explanation"):
            rows.append(("why", placement["explanation"]))
    return [f"{label:<11} {value}" for label, value in rows]


def _table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


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


def cmd_submit(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    fields, raw = load_job_file(args.jobfile)
    fields = resolve_profile(client, fields)
    headers: dict[str, str] = {}
    key = (
        None if args.no_idempotency_key else (args.idempotency_key or default_idempotency_key(raw))
    )
    if key:
        headers["Idempotency-Key"] = key
    status, job = client.request(
        "POST", "/api/v1/jobs/", body=fields, headers=headers, retry=bool(key)
    )
    if args.json:
        _emit_json(job, out)
    elif args.quiet:
        out.write(f"{job['id']}\n")
    else:
        if status == 201:
            out.write(f"Submitted job {job['id']} ({job['name']}): {job['state']}\n")
        else:
            out.write(
                f"Job {job['id']} ({job['name']}) was already submitted with this idempotency "
                f"key; it is {job['state']}. Use --idempotency-key or --no-idempotency-key "
                "for a new job.\n"
            )
        out.write(f"  {client.url}/jobs/{job['id']}/\n")
    return EXIT_OK


def cmd_status(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    _, job = client.request("GET", _job_path(args.id), not_found=_not_found(args.id))
    if args.json:
        _emit_json(job, out)
    else:
        out.write("\n".join(_job_lines(job)) + "\n")
    return EXIT_OK


def cmd_wait(
    client: Client,
    args: argparse.Namespace,
    out: IO[str],
    err: IO[str],
    *,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    started = clock()
    spinner = itertools.cycle("|/-\\")
    live = err.isatty()
    last_state = None
    try:
        while True:
            _, job = client.request("GET", _job_path(args.id), not_found=_not_found(args.id))
            state = job.get("state")
            waited = clock() - started
            if live:
                err.write(f"\r{next(spinner)} job {args.id} {state}  {_duration(waited)}   ")
                err.flush()
            elif state != last_state:
                err.write(f"job {args.id}: {state}\n")
            last_state = state
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
        out.write(f"Job {args.id} {state}" + (f": {'; '.join(detail)}" if detail else "") + "\n")
    return EXIT_OK if state == "COMPLETED" else EXIT_JOB_NOT_COMPLETED


def cmd_cancel(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    _, job = client.request(
        "POST", _job_path(args.id) + "cancel/", retry=True, not_found=_not_found(args.id)
    )
    if args.json:
        _emit_json(job, out)
    else:
        out.write(f"Cancelled job {job['id']} ({job.get('name', '')}): {job['state']}\n")
    return EXIT_OK


def cmd_jobs(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    params: dict[str, Any] = {"page_size": min(args.limit, 500)}
    if args.state:
        params["state"] = args.state.upper()
    if args.search:
        params["search"] = args.search
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
    headers = [
        "ID",
        "STATE",
        "KIND",
        "GPUS",
        "SUBMITTED",
        *(["OWNER"] if show_owner else []),
        "NAME",
    ]
    rows = [
        [
            job["id"],
            job["state"],
            job.get("kind", ""),
            job.get("gpus", ""),
            _when(job.get("submitted_at"))[:16],
            *([job.get("owner", "")] if show_owner else []),
            job.get("name", ""),
        ]
        for job in jobs
    ]
    out.write(_table(rows, headers) + "\n")
    if total > len(jobs):
        err.write(f"({len(jobs)} of {total} jobs shown; use --limit or --state)\n")
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


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


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

    p = sub.add_parser("submit", parents=[common], help="submit a job file (YAML or JSON)")
    p.add_argument("jobfile", help="path to the job file, or - for standard input")
    keys = p.add_mutually_exclusive_group()
    keys.add_argument(
        "--idempotency-key",
        help="retry-safety key (default: derived from the file's content, so a retried CI "
        "step with the same file returns the same job)",
    )
    keys.add_argument("--no-idempotency-key", action="store_true", help="always create a new job")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the job id")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("status", parents=[common], help="show one job")
    p.add_argument("id", type=_positive_int)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "wait", parents=[common], help="wait for a job to finish (exit 0 only if COMPLETED)"
    )
    p.add_argument("id", type=_positive_int)
    p.add_argument("--timeout", type=_seconds, help="give up after this many seconds (exit 6)")
    p.add_argument(
        "--interval", type=_seconds, default=3.0, help="seconds between polls (default 3)"
    )
    p.set_defaults(func=cmd_wait)

    p = sub.add_parser("cancel", parents=[common], help="cancel a job that has not finished")
    p.add_argument("id", type=_positive_int)
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("jobs", parents=[common], help="list your jobs (staff: all jobs)")
    p.add_argument("--state", help="state(s), comma-separated, e.g. PENDING,RUNNING")
    p.add_argument("--search", help="substring of the job name")
    p.add_argument("--limit", type=int, default=50, help="at most this many jobs (default 50)")
    p.set_defaults(func=cmd_jobs)
    return parser


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
