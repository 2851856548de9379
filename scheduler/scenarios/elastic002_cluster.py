"""Scenario ``elastic002_cluster``: elastic jobs sharing a small cluster (seed 002).

docs/elastic.md ("The simulator") describes it and its results.

    python -m scheduler.reproduce elastic002_cluster [--seeds 5] [--out DIR]

``elastic002`` runs one job at a time; here ``jobs`` jobs arrive as a Poisson stream (mean gap
``3600 / jobs_per_hour`` s, the first at 0) on nodes of 4 V100 (``layouts``: 2 and 4 nodes)
and run in the cluster simulator (``scheduler.simulator.engine``), which applies the
``elastic`` policy's ``SET_WORKERS`` and ``REPLACE_WORKERS``. Each job is a Gavel job type with
V100 throughputs measured at 1, 2, 4 and 8 GPUs, consolidated and unconsolidated (19 curves of
``data/gavel/solo_throughput.csv``), drawn uniformly; its work is ``U_log(hours_low,
hours_high)`` hours on one V100 (``total_steps`` = hours x the measured one-GPU throughput). All
draws come from the seed; the same seed gives every mode the same jobs.

Modes (every job of a run the same way):

- ``static1``, ``static2``, ``static4``: ``fifo`` with that many GPUs per job, fixed;
- ``elastic``: the ``elastic`` policy, jobs start at ``start_workers`` (2), bounds 1..8, K = 2,
  condition 1 only; it yields to the queue (steps grown jobs down so a waiting job can start);
- ``elastic_noyield``: the same with ``yield_to_queue`` off (jobs keep what they grew to until
  they end);
- ``elastic_value``: the same, each job declaring that an hour sooner is worth
  ``value_per_hour`` GPU-hours (condition 2 weighs each step's GPUs against the time saved);
- ``elastic_node`` (``clean`` and ``faults``): ``elastic`` with K = the GPUs of the job's node
  (4), the paper's "GPUs per machine".

Loads (``loads``): ``light``, 3 jobs an hour, and ``heavy``, 12 an hour.

Variants: ``clean``; ``faults`` (the seeded straggler model of ``elastic002``, on every mode,
plus ``replace4``: the ``elastic`` policy with bounds 4..4, so it only replaces stragglers);
``batch2x`` and ``batch4x`` (each job declares a maximum global batch of 2 or 4 times its local
batch: a static run whose workers x local batch would exceed it runs at ``floor(max / workers)``,
static 4 at half its local batch under ``batch2x``; the engine caps elastic jobs at 2 or 4
workers and grows their local batch below that; throughputs from Gavel's rows of the same model
at those batch sizes).

Every mode pays a 60 s warm-up at each start; an added worker or spare warms up 60 s and each
change of the group stops the job 5 s (``ElasticModel``). GPU-hours count every GPU a job
held, warming ones included.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints

from scheduler.cluster_spec import ClusterSpec, parse_cluster_spec
from scheduler.domain import JobKind, JobSpec, Profile
from scheduler.policies.registry import build_policy
from scheduler.simulator import SimConfig, simulate
from scheduler.simulator.elastic import (
    ElasticModel,
    ScalingCurve,
    StragglerFaults,
    load_curve_table,
    load_curves,
)

STATIC_COUNTS = (1, 2, 4)
GPUS_PER_NODE = 4


@dataclass(frozen=True, slots=True)
class Elastic002Cluster:
    """The scenario's settings (module docstring)."""

    jobs: int = 24
    loads: tuple[tuple[str, float], ...] = (("light", 3.0), ("heavy", 12.0))  # jobs per hour
    hours_low: float = 0.5
    hours_high: float = 2.0
    layouts: tuple[tuple[str, int], ...] = (("2x4", 2), ("4x4", 4))
    start_workers: int = 2
    min_workers: int = 1
    max_workers: int = 8
    scale_step_workers: int = 2
    value_per_hour: float = 2.0
    warmup_s: float = 60.0
    regroup_s: float = 5.0
    noise_sd: float = 0.02
    faults: StragglerFaults = StragglerFaults(
        persistent_per_hour=0.25, slow_factor=0.5, transient_per_hour=4.0, transient_factor=0.6
    )
    batch_factors: tuple[int, ...] = (2, 4)  # batch variants: max global = this x local batch


ELASTIC002_CLUSTER = Elastic002Cluster()


def cluster_of(nodes: int) -> ClusterSpec:
    return parse_cluster_spec(
        {
            "nodes": [
                {
                    "name": "v100",
                    "count": nodes,
                    "gpu_model": "V100",
                    "gpus_per_node": GPUS_PER_NODE,
                    "cpus": 32,
                }
            ]
        }
    )


@dataclass(frozen=True, slots=True)
class Draw:
    """One job of the stream: its curve, arrival and work."""

    curve: ScalingCurve
    arrival_s: float
    total_steps: float


def draw_jobs(sc: Elastic002Cluster, seed: int, jobs_per_hour: float) -> list[Draw]:
    """The seeded job stream (the same for every mode)."""
    curves = [c for c in load_curves() if c.gpu_type == "v100"]
    types = random.Random(seed)
    gaps = random.Random(seed + 1)
    sizes = random.Random(seed + 2)
    out = []
    t = 0.0
    lo, hi = math.log(sc.hours_low), math.log(sc.hours_high)
    for i in range(sc.jobs):
        curve = types.choice(curves)
        if i:
            t += gaps.expovariate(jobs_per_hour / 3600.0)
        hours = math.exp(sizes.uniform(lo, hi))
        out.append(Draw(curve, t, curve.consolidated[1] * hours * 3600.0))
    return out


def job_specs(
    sc: Elastic002Cluster,
    draws: Sequence[Draw],
    gpus: int,
    *,
    elastic: tuple[int, int] | None = None,
    value_per_hour: float | None = None,
    batch_factor: int | None = None,
) -> list[JobSpec]:
    """The stream as jobs of ``gpus`` GPUs; ``elastic``: their worker range."""
    table = load_curve_table()
    out = []
    for i, d in enumerate(draws):
        local = table.batch.get(d.curve.job_type)
        per_node = min(gpus, GPUS_PER_NODE)
        profile = Profile(
            name=d.curve.job_type,
            kind=JobKind.DL_TRAIN,
            gpu_time_s={"V100": d.total_steps / d.curve.throughput(gpus, per_node)},
            batch_size=local,
        )
        out.append(
            JobSpec(
                id=f"e{i:02d}",
                name=d.curve.job_type,
                kind=JobKind.DL_TRAIN,
                arrival_s=d.arrival_s,
                gpus=gpus,
                profile=profile,
                job_type=d.curve.job_type,
                params={"total_steps": d.total_steps},
                elastic_min=elastic[0] if elastic else None,
                elastic_max=elastic[1] if elastic else None,
                elastic_value_per_hour=value_per_hour if elastic else None,
                max_global_batch=batch_factor * local if batch_factor and local else None,
            )
        )
    return out


def _modes(sc: Elastic002Cluster, variant: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(mode, policy, job_specs keywords) of a variant."""
    modes: list[tuple[str, str, dict[str, Any]]] = [
        (f"static{w}", "fifo", {"gpus": w}) for w in STATIC_COUNTS
    ]
    bounds = (sc.min_workers, sc.max_workers)
    modes.append(("elastic", "elastic", {"gpus": sc.start_workers, "elastic": bounds}))
    modes.append(("elastic_noyield", "elastic", {"gpus": sc.start_workers, "elastic": bounds}))
    modes.append(
        (
            "elastic_value",
            "elastic",
            {"gpus": sc.start_workers, "elastic": bounds, "value_per_hour": sc.value_per_hour},
        )
    )
    if variant in ("clean", "faults"):
        modes.append(("elastic_node", "elastic", {"gpus": sc.start_workers, "elastic": bounds}))
    if variant == "faults":
        modes.append(("replace4", "elastic", {"gpus": 4, "elastic": (4, 4)}))
    return modes


def run_elastic002_cluster(
    sc: Elastic002Cluster = ELASTIC002_CLUSTER,
    seeds: int = 5,
    progress: Callable[[str], None] | None = None,
    variants: Sequence[str] | None = None,
) -> pd.DataFrame:
    """One row per (load, layout, variant, mode, seed)."""
    if variants is None:
        variants = ("clean", "faults", *(f"batch{f}x" for f in sc.batch_factors))
    rows = []
    total = len(sc.loads) * len(sc.layouts) * len(variants) * seeds
    n = 0
    for (load, per_hour), (layout, nodes) in product(sc.loads, sc.layouts):
        cluster = cluster_of(nodes)
        for variant in variants:
            factor = int(variant[5:-1]) if variant.startswith("batch") else None
            for seed in range(seeds):
                n += 1
                if progress is not None:
                    progress(f"elastic002_cluster: {n}/{total} {load} {layout} {variant} {seed}")
                draws = draw_jobs(sc, seed, per_hour)
                model = ElasticModel(
                    warmup_s=sc.warmup_s,
                    regroup_s=sc.regroup_s,
                    noise_sd=sc.noise_sd,
                    faults=sc.faults if variant == "faults" else StragglerFaults(),
                    seed=seed,
                    static_jobs=True,
                )
                for mode, policy_name, kw in _modes(sc, variant):
                    jobs = job_specs(sc, draws, batch_factor=factor, **kw)
                    # elastic_node: K = the GPUs of the job's node (the paper's "GPUs per machine")
                    step = 0 if mode == "elastic_node" else sc.scale_step_workers
                    params: dict[str, Any] = {}
                    if policy_name == "elastic":
                        params = {"scale_step_workers": step}
                    if mode == "elastic_noyield":
                        params["yield_to_queue"] = False
                    policy = build_policy(policy_name, params)
                    result = simulate(
                        cluster, jobs, policy, config=SimConfig(seed=seed, elastic_model=model)
                    )
                    rows.append({"load": load, **_row(result, layout, variant, mode, seed)})
    return pd.DataFrame(rows)


def _row(result: Any, layout: str, variant: str, mode: str, seed: int) -> dict[str, Any]:
    done = [r for r in result.jobs if r.finish_s is not None]
    complete = len(done) == len(result.jobs)
    events = result.elastic_events
    return {
        "layout": layout,
        "variant": variant,
        "mode": mode,
        "seed": seed,
        "jobs": len(result.jobs),
        "completed": len(done),
        "avg_jct_h": sum(r.jct_s for r in done) / len(done) / 3600.0 if complete else math.nan,
        "makespan_h": (
            (max(r.finish_s for r in done) - min(r.arrival_s for r in result.jobs)) / 3600.0
            if complete
            else math.nan
        ),
        "avg_queue_h": sum(r.queue_s for r in done) / len(done) / 3600.0 if complete else math.nan,
        "gpu_h": sum(result.gpu_seconds.values()) / 3600.0,
        "scale_changes": sum(e.kind == "set_workers" for e in events),
        "replacements": sum(e.kind == "applied" and e.text.startswith("ranks") for e in events),
        "skipped": sum(e.kind.startswith("skipped") for e in events),
        "max_workers": max(
            [e.workers_to for e in events if e.kind in ("applied", "set_workers")], default=0
        ),
    }


def summarize_elastic002_cluster(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (load, layout, variant, mode): jobs completed over the seeds ("N of M"), the means over
    the seeds of average JCT, makespan, queueing and GPU-hours, and the elastic changes;
    ``vs_best_static_jct_pct``: the mean JCT against the best static mode's (same layout and
    variant)."""
    out = []
    for (load, layout, variant), group in runs.groupby(["load", "layout", "variant"], sort=False):
        means = {}
        for mode, g in group.groupby("mode", sort=False):
            means[mode] = g.avg_jct_h.mean(skipna=False)
        statics = {m: v for m, v in means.items() if m.startswith("static") and not math.isnan(v)}
        best = min(statics, key=lambda m: statics[m]) if statics else None
        for mode, g in group.groupby("mode", sort=False):
            done, jobs = int(g.completed.sum()), int(g.jobs.sum())
            row = {
                "load": load,
                "layout": layout,
                "variant": variant,
                "mode": mode,
                "seeds": len(g),
                "completed": f"{done} of {jobs}",
                # NaN when a seed's run left a job unfinished ("N of M completed")
                "avg_jct_h": g.avg_jct_h.mean(skipna=False),
                "makespan_h": g.makespan_h.mean(skipna=False),
                "avg_queue_h": g.avg_queue_h.mean(skipna=False),
                "gpu_h": g.gpu_h.mean(),
                "scale_changes": g.scale_changes.mean(),
                "replacements": g.replacements.mean(),
                "skipped": g.skipped.mean(),
                "vs_best_static_jct_pct": (
                    100.0 * (means[mode] / statics[best] - 1.0) if best else math.nan
                ),
                "best_static": best,
            }
            out.append(row)
    return pd.DataFrame(out)
