"""Job files for ``cosched submit``: YAML or JSON, read into the API's job fields, and the
idempotency key derived from the file's bytes."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import IO, Any

import yaml

from portal.cli.client import EXIT_BAD_INPUT, CliError


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
