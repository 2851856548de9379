"""The ``cosched`` command line: argument types, the subcommands and their options
(``build_parser``), and the shell completion written from that parser."""

from __future__ import annotations

import argparse
from typing import IO, Any

from portal.cli.client import DEFAULT_URL, EXIT_OK
from portal.cli.cluster import cmd_nodes, cmd_profile, cmd_projects, cmd_usage
from portal.cli.jobs import (
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
)


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
