"""``cosched``: submit and follow Cosched jobs from a terminal or a CI pipeline.

A plain HTTP client of the REST API (``requests``); it imports nothing from Django. The
package: ``client`` (HTTP, ``CliError``, exit codes), ``jobfiles`` (reading job files),
``output`` (printing), ``jobs`` and ``cluster`` (the commands), ``parser`` (the command line and
shell completion); ``main`` is here.

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

import os
import sys
from collections.abc import Sequence
from typing import IO, NoReturn

from portal.cli.client import (
    DEFAULT_URL,
    EXIT_AUTH,
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_JOB_NOT_COMPLETED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_SERVER,
    EXIT_TIMEOUT,
    RETRYABLE_STATUS,
    TERMINAL_STATES,
    Client,
    CliError,
    _connection_message,
    _field_errors_message,
)
from portal.cli.cluster import (
    _isolation_text,
    _node_operation,
    cmd_nodes,
    cmd_profile,
    cmd_projects,
    cmd_usage,
)
from portal.cli.jobfiles import default_idempotency_key, load_job_file
from portal.cli.jobs import (
    _job_path,
    _not_found,
    _post_verb,
    _state_line,
    _submit_bulk,
    cmd_cancel,
    cmd_history,
    cmd_hold,
    cmd_jobs,
    cmd_logs,
    cmd_pause,
    cmd_release,
    cmd_requeue,
    cmd_resume,
    cmd_status,
    cmd_submit,
    cmd_update,
    cmd_wait,
    new_log_text,
)
from portal.cli.output import (
    _duration,
    _elastic_text,
    _emit_json,
    _job_lines,
    _limit_text,
    _profile_text,
    _shorten,
    _table,
    _when,
)
from portal.cli.parser import (
    JOB_FILE_HELP,
    _memory_mb,
    _positive_int,
    _seconds,
    _time_limit,
    build_parser,
    cmd_completion,
    completion_script,
)

# Every name the single-file module had stays importable from ``portal.cli``.
__all__ = [
    "DEFAULT_URL",
    "TERMINAL_STATES",
    "RETRYABLE_STATUS",
    "EXIT_OK",
    "EXIT_JOB_NOT_COMPLETED",
    "EXIT_BAD_INPUT",
    "EXIT_AUTH",
    "EXIT_NOT_FOUND",
    "EXIT_SERVER",
    "EXIT_TIMEOUT",
    "EXIT_INTERRUPTED",
    "CliError",
    "Client",
    "_connection_message",
    "_field_errors_message",
    "load_job_file",
    "default_idempotency_key",
    "_when",
    "_job_lines",
    "_elastic_text",
    "_limit_text",
    "_profile_text",
    "_table",
    "_shorten",
    "_emit_json",
    "_duration",
    "_job_path",
    "_not_found",
    "_submit_bulk",
    "cmd_submit",
    "cmd_status",
    "_state_line",
    "cmd_wait",
    "new_log_text",
    "cmd_logs",
    "cmd_cancel",
    "_post_verb",
    "cmd_hold",
    "cmd_release",
    "cmd_requeue",
    "cmd_pause",
    "cmd_resume",
    "cmd_update",
    "cmd_jobs",
    "cmd_history",
    "cmd_profile",
    "_node_operation",
    "cmd_nodes",
    "_isolation_text",
    "cmd_projects",
    "cmd_usage",
    "_positive_int",
    "_time_limit",
    "_seconds",
    "_memory_mb",
    "JOB_FILE_HELP",
    "build_parser",
    "completion_script",
    "cmd_completion",
    "main",
]


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
