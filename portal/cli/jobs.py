"""The ``cosched`` commands about jobs: submit, status, wait, logs, cancel, hold / release /
requeue / pause / resume, update, jobs (the queue) and history (finished jobs)."""

from __future__ import annotations

import argparse
import itertools
import shutil
import time
from collections.abc import Callable
from typing import IO, Any

from portal.cli.client import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_JOB_NOT_COMPLETED,
    EXIT_OK,
    EXIT_TIMEOUT,
    TERMINAL_STATES,
    Client,
    CliError,
)
from portal.cli.jobfiles import default_idempotency_key, load_job_file
from portal.cli.output import _duration, _emit_json, _job_lines, _shorten, _table, _when


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


def _fetch_jobs(
    client: Client, params: dict[str, Any], limit: int
) -> tuple[list[dict[str, Any]], int]:
    """``GET /api/v1/jobs/`` with ``params``: the first ``limit`` jobs and the total count."""
    _, data = client.request("GET", "/api/v1/jobs/", params=params)
    jobs = (data.get("results", []) if isinstance(data, dict) else data)[:limit]
    total = data.get("count", len(jobs)) if isinstance(data, dict) else len(jobs)
    return jobs, total


def cmd_jobs(client: Client, args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    params: dict[str, Any] = {"page_size": min(args.limit, 500)}
    if args.state:
        params["state"] = args.state.upper()
    if args.search:
        params["search"] = args.search
    if getattr(args, "array", None):
        params["array"] = args.array
    jobs, total = _fetch_jobs(client, params, args.limit)
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
    jobs, total = _fetch_jobs(client, params, args.limit)
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
