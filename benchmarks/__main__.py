"""Run the registered benchmarks: ``python -m benchmarks [--quick] [--json FILE] [NAME ...]``.

Prints the machine it ran on, each benchmark's own table, and a one-screen summary. A missing
module or a benchmark that raises is reported and makes the exit code 1; the others still run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from benchmarks import BENCHMARKS, DESCRIPTIONS

RULE = "=" * 78


@dataclass
class Outcome:
    name: str
    status: str  # "ok", "missing" or "failed"
    seconds: float
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def machine_facts() -> dict[str, str]:
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu": cpu_model(),
        "nproc": str(usable_cpus()),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }


def run_one(name: str, quick: bool) -> Outcome:
    module_path = BENCHMARKS[name]
    started = time.perf_counter()

    def failed(error: str) -> Outcome:
        return Outcome(name, "failed", time.perf_counter() - started, error=error)

    try:
        module = importlib.import_module(module_path)
    except ModuleNotFoundError as exc:
        if exc.name == module_path:  # the benchmark itself is absent, not one of its imports
            return Outcome(name, "missing", 0.0, error=f"module {module_path} not found")
        return failed(traceback.format_exc())
    except Exception:
        return failed(traceback.format_exc())
    runner = getattr(module, "run", None)
    if not callable(runner):
        return failed(f"{module_path} has no run(quick) function")
    try:
        result = runner(quick=quick)
    except Exception:
        return failed(traceback.format_exc())
    if not isinstance(result, dict):
        return failed(f"run() returned {type(result).__name__}, expected dict")
    return Outcome(name, "ok", time.perf_counter() - started, result=result)


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value == 0 or abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


def key_figures(result: dict[str, Any]) -> dict[str, Any]:
    """What goes on the summary: ``result["summary"]`` if given, else top-level scalars."""
    summary = result.get("summary")
    if isinstance(summary, dict):
        return summary
    return {
        key: value
        for key, value in result.items()
        if isinstance(value, int | float | str) and not isinstance(value, bool)
    }


def print_summary(outcomes: list[Outcome], facts: dict[str, str], quick: bool) -> None:
    print()
    print(RULE)
    mode = "quick" if quick else "full"
    print(f"Summary ({mode} run, {facts['date']}, {facts['nproc']} CPUs, {facts['cpu']})")
    print(RULE)
    for outcome in outcomes:
        head = f"{outcome.name:<10} {outcome.status.upper():<8}"
        if outcome.status != "ok":
            reason = outcome.error.strip().splitlines()[-1] if outcome.error.strip() else ""
            print(f"{head} {reason}")
            continue
        print(f"{head} ({outcome.seconds:.1f} s)")
        for label, value in key_figures(outcome.result).items():
            print(f"    {label:<48} {_format_value(value):>20}")
    print(RULE)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    names = ", ".join(f"{name} ({DESCRIPTIONS.get(name, '')})" for name in BENCHMARKS)
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=f"Run Cosched's benchmarks. Available, in order: {names}.",
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--json", metavar="FILE", help="also write facts and results to FILE")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for name, module_path in BENCHMARKS.items():
            print(f"{name:<10} {module_path:<36} {DESCRIPTIONS.get(name, '')}")
        return 0
    selected = args.names or list(BENCHMARKS)
    # Run in registry order whatever order the names were given in, each once.
    selected = [name for name in BENCHMARKS if name in selected]

    facts = machine_facts()
    print(RULE)
    print("Cosched benchmarks" + (" (quick)" if args.quick else ""))
    for key, value in facts.items():
        print(f"  {key:<7} {value}")
    print(f"  run     {', '.join(selected)}")
    print(RULE, flush=True)

    outcomes: list[Outcome] = []
    for name in selected:
        print(f"\n--- {name}: {DESCRIPTIONS.get(name, BENCHMARKS[name])}", flush=True)
        outcome = run_one(name, args.quick)
        if outcome.status == "missing":
            print(f"!!! {name}: not run, {outcome.error}", file=sys.stderr, flush=True)
        elif outcome.status == "failed":
            print(f"!!! {name}: FAILED\n{outcome.error}", file=sys.stderr, flush=True)
        outcomes.append(outcome)
        sys.stdout.flush()

    print_summary(outcomes, facts, args.quick)
    if args.json:
        payload = {
            "facts": facts,
            "quick": args.quick,
            "benchmarks": {
                outcome.name: {
                    "status": outcome.status,
                    "seconds": round(outcome.seconds, 3),
                    "result": outcome.result,
                    "error": outcome.error,
                }
                for outcome in outcomes
            },
        }
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(payload, out, indent=2, default=str)
        print(f"results written to {args.json}")
    return 0 if all(outcome.status == "ok" for outcome in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
