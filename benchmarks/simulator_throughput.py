"""Simulator throughput: a 10,000-job trace replayed on a 1,000-GPU cluster, one child process
per policy.

    python -m benchmarks.simulator_throughput [--quick]

The trace is generated deterministically (``make_trace``) from the Gavel job types and their
measured solo throughputs, in the Gavel trace CSV format, and read back with
``scheduler.traces.read_trace`` like any trace:

- job type uniform over the 26 Gavel types; scale factor 1 (80 %), 2 (10 %), 4 (7 %) or 8
  (3 %) where Gavel measured the type at that scale (else 1);
- run time on one V100 set of its GPUs: ``60 * 10**U(1.5, 3)`` s (30 min to 17 h) for 80 % of
  the jobs, ``60 * 10**U(3, 4)`` s (17 h to 7 days) for the rest, the shape of Gavel's own
  generator; ``total_steps`` = that time x the V100 throughput, so other GPU models take what
  Gavel measured for them;
- Poisson arrivals whose rate puts the offered load at ``LOAD`` (0.8) of the cluster's
  capacity in V100-equivalents (per-model speed from the median measured throughput ratio).

The cluster is ``nodes x 8`` GPUs, a third each of K80, P100 and V100 nodes. Interference is the
measured (Gavel) model, OOM action requeue, seed 0. Each replay runs in a fresh child process
(``multiprocessing`` spawn), which reports the simulator's own wall time (``SimResult.wall_s``:
the event loop, policy calls included; not the trace reading), its events, and its peak
resident memory (``getrusage(RUSAGE_SELF).ru_maxrss`` at the end, and before the trace was read,
so the replay's own share is visible).

Goal (issue 3): a 10,000-job trace on 1,000 GPUs replayed in < 60 s on one core.
"""

from __future__ import annotations

import argparse
import csv
import math
import multiprocessing
import random
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

GOAL_S = 60.0
LOAD = 0.8
MODELS = ("K80", "P100", "V100")
GPUS_PER_NODE = 8
SCALES = ((1, 0.80), (2, 0.10), (4, 0.07), (8, 0.03))

FULL = {"jobs": 10_000, "gpus": 1_000, "policies": ("fifo", "binpack", "mystic", "hetero_srtf")}
QUICK = {"jobs": 300, "gpus": 48, "policies": ("fifo", "binpack")}


def _v100_equivalents() -> dict[str, float]:
    """Speed of each model relative to V100: the median over job types of the measured
    throughput ratio at scale factor 1."""
    from scheduler.traces import load_solo_throughputs

    ratios: dict[str, list[float]] = {m: [] for m in MODELS}
    for (_, scale), tputs in load_solo_throughputs().items():
        if scale == 1 and tputs.get("V100"):
            for m in MODELS:
                if tputs.get(m):
                    ratios[m].append(tputs[m] / tputs["V100"])
    return {m: statistics.median(v) if v else 1.0 for m, v in ratios.items()}


def cluster_spec(gpus: int) -> dict[str, Any]:
    """The cluster spec mapping (``scheduler.cluster_spec`` format): nodes of 8 GPUs, K80,
    P100 and V100 in thirds (the remainder goes to V100)."""
    nodes = max(1, math.ceil(gpus / GPUS_PER_NODE))
    third = nodes // 3
    counts = {"K80": third, "P100": third, "V100": nodes - 2 * third}
    return {
        "nodes": [
            {
                "name": m.lower(),
                "count": c,
                "gpu_model": m,
                "gpus_per_node": GPUS_PER_NODE,
                "cpus": 64,
            }
            for m, c in counts.items()
            if c > 0
        ]
    }


def make_trace(path: Path, jobs: int, gpus: int, seed: int = 0) -> dict[str, Any]:
    """Write a Gavel-format trace of ``jobs`` jobs for a ``gpus``-GPU cluster to ``path``
    (module docstring); returns its facts. Same arguments, same file."""
    from scheduler.traces import load_solo_throughputs

    table = load_solo_throughputs()
    types = sorted(t for t, s in table if s == 1)
    rng = random.Random(seed)
    rows = []
    work = 0.0  # V100 GPU-seconds
    for k in range(jobs):
        job_type = rng.choice(types)
        draw, scale = rng.random(), 1
        for s, p in SCALES:
            if draw < p:
                scale = s
                break
            draw -= p
        if not table.get((job_type, scale), {}).get("V100"):
            scale = 1
        lo, hi = (1.5, 3.0) if rng.random() < 0.8 else (3.0, 4.0)
        v100_s = 60.0 * 10 ** rng.uniform(lo, hi)
        steps = round(v100_s * table[(job_type, scale)]["V100"])
        rows.append([k, job_type, steps, scale])
        work += v100_s * scale
    speed = _v100_equivalents()
    spec = cluster_spec(gpus)
    capacity = sum(g["count"] * g["gpus_per_node"] * speed[g["gpu_model"]] for g in spec["nodes"])
    mean_gap = work / (capacity * LOAD) / jobs
    t = 0.0
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["job_id", "job_type", "arrival_time_s", "total_steps", "scale_factor"])
        for job_id, job_type, steps, scale in rows:
            out.writerow([job_id, job_type, f"{t:.1f}", steps, scale])
            t += rng.expovariate(1.0 / mean_gap)
    return {"jobs": jobs, "span_s": t, "v100_work_s": work, "capacity_v100_eq": capacity}


def _maxrss_mb() -> float:
    # Linux reports kilobytes (macOS bytes; not a target here).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class _OverLimit(Exception):
    """The replay ran past its wall-clock limit (raised from the job-end callback)."""


def replay(
    trace: str,
    gpus: int,
    policy: str,
    progress: bool,
    limit_s: float | None = None,
    round_s: float | None = None,
) -> dict[str, Any]:
    """Replay ``trace`` under ``policy`` in this process; returns the figures. Runs in the
    child process (see ``run``). ``limit_s``: stop at the first job end after that many
    seconds of wall time and return how far it got (``finished`` False, ``jobs_done``,
    ``sim_s`` reached, ``wall_s`` so far) instead of the figures of a whole run.
    ``round_s``: the policy decides only every so many seconds (``SimConfig.round_s``, as
    Gavel and the peers' comparison); None: on every arrival and completion."""
    from scheduler.cluster_spec import parse_cluster_spec
    from scheduler.interference import build_interference
    from scheduler.policies.registry import build_policy
    from scheduler.simulator.engine import Simulator
    from scheduler.simulator.results import EndReason, SimConfig
    from scheduler.traces import read_trace

    base_mb = _maxrss_mb()
    t0 = time.perf_counter()
    jobs = read_trace(trace, fmt="gavel")
    read_s = time.perf_counter() - t0
    cluster = parse_cluster_spec(cluster_spec(gpus))
    bar = None
    on_end = None
    if progress and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), unit="job", desc=policy, file=sys.stderr, leave=False)
        seen = [0]

        def on_end(done: int, total: int) -> None:
            bar.update(done - seen[0])
            seen[0] = done

    sim = Simulator(
        cluster,
        jobs,
        build_policy(policy),
        interference=build_interference("measured"),
        config=SimConfig(seed=0, round_s=round_s),
        on_job_end=on_end,
    )
    t_start = time.perf_counter()
    if limit_s is not None:
        shown = on_end

        def stop_at_limit(done: int, total: int) -> None:
            if shown is not None:
                shown(done, total)
            if time.perf_counter() - t_start > limit_s:
                raise _OverLimit(done)

        sim.on_job_end = stop_at_limit
    try:
        result = sim.run()
    except _OverLimit as stop:
        wall = time.perf_counter() - t_start
        return {
            "policy": policy,
            "jobs": len(jobs),
            "gpus": sim.gpu_count,
            "round_s": round_s,
            "finished": False,
            "limit_s": limit_s,
            "jobs_done": stop.args[0],
            "sim_s": sim.now,
            "running": len(sim.running),
            "policy_calls": sim.policy_calls,
            "wall_s": wall,
            "policy_share": sum(sim.latencies) / wall if wall > 0 else 0.0,
            "base_rss_mb": base_mb,
            "peak_rss_mb": _maxrss_mb(),
        }
    finally:
        if bar is not None:
            bar.close()
    completed = sum(1 for r in result.jobs if r.end_reason == EndReason.COMPLETED)
    wall = result.wall_s
    latencies = sorted(result.decision_latency_s)
    return {
        "policy": policy,
        "jobs": len(jobs),
        "gpus": result.gpu_count,
        "round_s": round_s,
        "finished": True,
        "completed": completed,
        "oom_count": result.oom_count,
        "events": result.events,
        "policy_calls": result.policy_calls,
        "wall_s": wall,
        "read_s": read_s,
        "jobs_per_s": len(jobs) / wall if wall > 0 else math.inf,
        "events_per_s": result.events / wall if wall > 0 else math.inf,
        "policy_share": sum(latencies) / wall if wall > 0 else 0.0,
        "decision_ms_p50": 1000.0 * latencies[len(latencies) // 2] if latencies else 0.0,
        "base_rss_mb": base_mb,
        "peak_rss_mb": _maxrss_mb(),
    }


def _child(
    conn: Any,
    trace: str,
    gpus: int,
    policy: str,
    progress: bool,
    limit_s: float | None,
    round_s: float | None = None,
) -> None:
    try:
        conn.send(("ok", replay(trace, gpus, policy, progress, limit_s, round_s)))
    except BaseException as exc:  # report, do not hang the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def replay_in_child(
    trace: str,
    gpus: int,
    policy: str,
    progress: bool = False,
    limit_s: float | None = None,
    round_s: float | None = None,
) -> dict[str, Any]:
    """``replay`` in a fresh (spawned) process, so its peak memory is its own."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, trace, gpus, policy, progress, limit_s, round_s))
    proc.start()
    child.close()
    try:
        status, payload = parent.recv()
    except EOFError:
        status, payload = "error", "child process died without a result"
    proc.join()
    if status != "ok":
        return {"policy": policy, "error": payload}
    return payload


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    head = (
        f"{'policy':<12}{'jobs':>7}{'done':>7}{'OOMs':>6}{'events':>9}{'wall s':>8}"
        f"{'jobs/s':>8}{'events/s':>10}{'policy %':>9}{'peak MB':>9}{'base MB':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['policy']:<12} error: {r['error']}")
            continue
        lines.append(
            f"{r['policy']:<12}{r['jobs']:>7,}{r['completed']:>7,}{r['oom_count']:>6,}"
            f"{r['events']:>9,}{r['wall_s']:>8.1f}{r['jobs_per_s']:>8,.0f}"
            f"{r['events_per_s']:>10,.0f}{100 * r['policy_share']:>9.0f}"
            f"{r['peak_rss_mb']:>9.0f}{r['base_rss_mb']:>9.0f}"
        )
    return "\n".join(lines)


def run(quick: bool = False, policies: Sequence[str] = ()) -> dict:
    """Generate the trace, replay it once per policy (each in a child process), print the
    table and return the figures."""
    sizes = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="cosched-bench-") as tmp:
        trace = Path(tmp) / "trace.csv"
        facts = make_trace(trace, int(sizes["jobs"]), int(sizes["gpus"]))
        print(
            f"Simulator throughput: {facts['jobs']:,} generated Gavel-type jobs over "
            f"{facts['span_s'] / 86400:.1f} days (offered load {LOAD:g}) on "
            f"{sizes['gpus']:,} GPUs (K80/P100/V100 nodes of 8); interference measured; "
            "one child process per replay"
        )
        rows = []
        for policy in policies or sizes["policies"]:
            print(f"  replaying {policy} ...", file=sys.stderr, flush=True)
            rows.append(replay_in_child(str(trace), int(sizes["gpus"]), policy, progress=not quick))
    print(format_rows(rows))
    ok = [r for r in rows if "error" not in r]
    worst = max(ok, key=lambda r: r["wall_s"]) if ok else None
    goal_met = bool(ok) and len(ok) == len(rows) and all(r["wall_s"] < GOAL_S for r in ok)
    if quick:
        print(f"(quick run: {sizes['jobs']} jobs; the goal applies to the full 10,000-job run)")
    elif worst is not None:
        print(
            f"Goal (10,000 jobs on 1,000 GPUs in < {GOAL_S:g} s on one core): "
            f"{'met' if goal_met else 'NOT met'}; slowest {worst['policy']} "
            f"{worst['wall_s']:.1f} s"
        )
    summary: dict[str, Any] = {}
    for r in ok:
        summary[f"{r['policy']} replay wall s ({r['jobs']:,} jobs)"] = round(r["wall_s"], 2)
        summary[f"{r['policy']} events/s"] = round(r["events_per_s"])
        summary[f"{r['policy']} peak RSS MB"] = round(r["peak_rss_mb"])
    if not quick:
        summary[f"goal < {GOAL_S:g} s"] = "met" if goal_met else "NOT met"
    return {
        "trace": facts,
        "gpus": sizes["gpus"],
        "replays": rows,
        "goal_s": GOAL_S,
        "goal_met": goal_met if not quick else None,
        "summary": summary,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.simulator_throughput", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="a small trace only (seconds)")
    parser.add_argument(
        "--policy",
        action="append",
        default=[],
        help="replay under this policy only (repeatable; default: the benchmark's list)",
    )
    args = parser.parse_args(argv)
    run(quick=args.quick, policies=args.policy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
