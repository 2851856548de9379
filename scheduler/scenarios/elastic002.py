"""Scenario ``elastic002``: static allocations vs the ``elastic`` engine (seed 002).

docs/elastic.md describes it and its results.

    python -m scheduler.reproduce elastic002 [--out DIR]

Every (job type, GPU model) Gavel measured at 1, 2, 4 and 8 GPUs, consolidated and
unconsolidated (55 curves of ``data/gavel/solo_throughput.csv``), is one job of fixed work: two
hours of training on one GPU of its model. It runs in two layouts, one node of 8 GPUs (every
count consolidated) and four nodes of 2 GPUs (more than 2 workers cross machines: Gavel's
unconsolidated throughputs), under:

- ``static1`` .. ``static8``: a fixed worker count for the whole run;
- ``elastic``: the engine of ``scheduler.elastic`` starting at K = 2 workers (the paper starts
  with one step of "a few" workers), bounds 1..8, adding or removing K = 2 (the GPUs of a
  machine in the 2-GPU layout; the same step in the 8-GPU one for comparability);
- ``elastic_from8``: the same engine started at 8 workers, a deliberate over-allocation: its
  *recovery time* is when the count took its final value, from the start of training;
- ``value`` and ``value_from8``: the same two with a utility: an hour sooner is worth
  ``value_per_hour`` (2) GPU-hours, so condition 2 weighs the GPUs a step costs against the
  time it saves (on Gavel's curves condition 1 alone never finds 8 workers wasteful: S from 4
  to 8 is at least 0.2 on every curve, consolidated or not).

And once more with the seeded straggler model on (``faults`` variant) for ``static*``,
``elastic`` and ``replace2/4/8``: the engine held at a fixed count (bounds w..w) so that it only
replaces persistent stragglers with warmed spares, while the static runs keep them.

Paper's figures (ResNet-56/CIFAR-10): completion -8.2 % to -16.0 % and GPU time -58.6 % to
-85.1 % vs static allocation, recovery from a misallocation in 61-78 s.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints

from scheduler import elastic as en
from scheduler.simulator.elastic import (
    ElasticSimConfig,
    ScalingCurve,
    StragglerFaults,
    load_curves,
    simulate_elastic,
)

#: Not measured: the shape of the paper's ResNet-56/CIFAR-10 curve (linear to 4 GPUs, flat
#: beyond), to show the engine where a knee exists; reported apart from Gavel's curves.
SYNTHETIC_KNEE = ScalingCurve(
    "synthetic knee at 4",
    "-",
    {1: 10.0, 2: 20.0, 4: 40.0, 8: 41.0},
    {1: 10.0, 2: 20.0, 4: 40.0, 8: 41.0},
)
PAPER_002 = {
    "completion_pct": (-16.0, -8.2),
    "gpu_time_pct": (-85.1, -58.6),
    "recovery_s": (61.0, 78.4),
}
STATIC_COUNTS = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class Elastic002:
    """The scenario's settings (module docstring)."""

    hours_on_one_gpu: float = 2.0
    layouts: tuple[tuple[str, int], ...] = (("1x8", 8), ("4x2", 2))
    start_workers: int = 2
    min_workers: int = 1
    max_workers: int = 8
    engine: en.ElasticConfig = en.ElasticConfig(scale_step_workers=2, scale_interval_batches=50)
    warmup_s: float = 60.0
    regroup_s: float = 5.0
    noise_sd: float = 0.02
    faults: StragglerFaults = StragglerFaults(
        persistent_per_hour=0.25, slow_factor=0.5, transient_per_hour=4.0, transient_factor=0.6
    )
    value_per_hour: float = 2.0
    seed: int = 2


ELASTIC002 = Elastic002()


def _config(sc: Elastic002, curve: ScalingCurve, per_node: int, **kw: Any) -> ElasticSimConfig:
    job = en.ElasticJob(sc.min_workers, sc.max_workers)
    base: dict[str, Any] = {
        "total_steps": curve.consolidated[1] * sc.hours_on_one_gpu * 3600.0,
        "start_workers": sc.start_workers,
        "job": job,
        "engine": sc.engine,
        "gpus_per_node": per_node,
        "warmup_s": sc.warmup_s,
        "regroup_s": sc.regroup_s,
        "noise_sd": sc.noise_sd,
        "seed": sc.seed,
    }
    base.update(kw)
    return ElasticSimConfig(**base)


def run_elastic002(
    sc: Elastic002 = ELASTIC002,
    curves: Sequence[ScalingCurve] | None = None,
    progress: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """One row per (curve, layout, variant, mode)."""
    rows = []
    todo = list(curves if curves is not None else load_curves())
    value = en.ElasticJob(
        sc.min_workers,
        sc.max_workers,
        en.Utility(en.UtilityKind.VALUE_PER_HOUR, value_per_hour=sc.value_per_hour),
    )
    for n, curve in enumerate(todo, 1):
        if progress is not None:
            progress(f"elastic002: {n}/{len(todo)} {curve.job_type} on {curve.gpu_type}")
        for layout, per_node in sc.layouts:
            for variant, faults in (("clean", StragglerFaults()), ("faults", sc.faults)):
                modes: list[tuple[str, dict[str, Any]]] = [
                    (f"static{w}", {"static": w}) for w in STATIC_COUNTS
                ]
                modes.append(("elastic", {}))
                if variant == "clean":
                    modes += [
                        ("elastic_from8", {"start_workers": sc.max_workers}),
                        ("value", {"job": value}),
                        ("value_from8", {"job": value, "start_workers": sc.max_workers}),
                    ]
                else:
                    modes += [
                        (f"replace{w}", {"start_workers": w, "job": en.ElasticJob(w, w)})
                        for w in STATIC_COUNTS
                        if w > 1
                    ]
                for mode, kw in modes:
                    kw.setdefault("seed", sc.seed * 100_000 + n)  # faults differ per curve
                    run = simulate_elastic(curve, _config(sc, curve, per_node, faults=faults, **kw))
                    rows.append(
                        {
                            "job_type": curve.job_type,
                            "gpu": curve.gpu_type,
                            "layout": layout,
                            "variant": variant,
                            "mode": mode,
                            "completion_s": run.completion_s,
                            "gpu_h": run.gpu_s / 3600.0,
                            "final_workers": run.final_workers,
                            "scale_changes": len(run.scale_changes),
                            "replacements": sum(c.kind == "replace" for c in run.changes),
                            "stragglers": run.persistent_stragglers,
                            "recovery_s": max(0.0, run.settled_s - sc.warmup_s),
                            "completed": run.completed,
                        }
                    )
    return pd.DataFrame(rows)


def _pct(a: float, b: float) -> float:
    return 100.0 * (a / b - 1.0)


def _spread(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):+.1f} [{min(values):+.1f}, {max(values):+.1f}]"


def _versus_static(
    clean: pd.DataFrame, keys: list[tuple[str, str]], layout: str, mode: str
) -> list[dict[str, Any]]:
    """Rows of one elastic mode against every static count, the fastest static, the counts it
    settled on and its recovery from 8 workers."""
    out: list[dict[str, Any]] = []
    el = {k: clean.loc[(*k, mode)] for k in keys}
    for w in STATIC_COUNTS:
        st = {k: clean.loc[(*k, f"static{w}")] for k in keys}
        out.append(
            {
                "layout": layout,
                "comparison": f"{mode} vs static{w}",
                "completion_pct": _spread(
                    [_pct(el[k].completion_s, st[k].completion_s) for k in keys]
                ),
                "gpu_time_pct": _spread([_pct(el[k].gpu_h, st[k].gpu_h) for k in keys]),
                "n": len(keys),
            }
        )
    best = {}
    for k in keys:
        times = {w: clean.loc[(*k, f"static{w}")].completion_s for w in STATIC_COUNTS}
        best[k] = clean.loc[(*k, f"static{min(times, key=lambda w: times[w])}")]
    out.append(
        {
            "layout": layout,
            "comparison": f"{mode} vs the fastest static per job",
            "completion_pct": _spread(
                [_pct(el[k].completion_s, best[k].completion_s) for k in keys]
            ),
            "gpu_time_pct": _spread([_pct(el[k].gpu_h, best[k].gpu_h) for k in keys]),
            "n": len(keys),
        }
    )
    for m in (mode, f"{mode}_from8"):
        finals = pd.Series([int(clean.loc[(*k, m)].final_workers) for k in keys])
        counts = finals.value_counts().sort_index()
        out.append(
            {
                "layout": layout,
                "comparison": f"{m} settled on (workers: jobs)",
                "completion_pct": ", ".join(f"{w}: {c}" for w, c in counts.items()),
                "gpu_time_pct": "",
                "n": len(keys),
            }
        )
    over = [clean.loc[(*k, f"{mode}_from8")] for k in keys]
    rec = [float(r.recovery_s) for r in over if r.final_workers < 8]
    out.append(
        {
            "layout": layout,
            "comparison": f"{mode}_from8: recovery (s) of the jobs that left 8",
            "completion_pct": _spread(rec).replace("+", ""),
            "gpu_time_pct": "",
            "n": len(rec),
        }
    )
    return out


def _knee_rows(sc: Elastic002 = ELASTIC002) -> list[dict[str, Any]]:
    """The engine on ``SYNTHETIC_KNEE`` (one node of 8 GPUs) against the static counts."""
    curve = SYNTHETIC_KNEE
    static = {w: simulate_elastic(curve, _config(sc, curve, 8, static=w)) for w in STATIC_COUNTS}
    out = []
    for start in (sc.start_workers, sc.max_workers):
        run = simulate_elastic(curve, _config(sc, curve, 8, start_workers=start))
        comp = [_pct(run.completion_s, static[w].completion_s) for w in STATIC_COUNTS]
        gpu = [_pct(run.gpu_s, static[w].gpu_s) for w in STATIC_COUNTS]
        out.append(
            {
                "layout": "knee",
                "comparison": f"synthetic knee, elastic from {start} -> {run.final_workers} "
                f"in {max(0.0, run.settled_s - sc.warmup_s):.0f} s, vs static 1/2/4/8",
                "completion_pct": " / ".join(f"{v:+.1f}" for v in comp),
                "gpu_time_pct": " / ".join(f"{v:+.1f}" for v in gpu),
                "n": 1,
            }
        )
    return out


def summarize_elastic002(runs: pd.DataFrame) -> pd.DataFrame:
    """Per layout: elastic vs each static count (median [min, max] over curves of the % change
    in completion time and GPU time), against the best static count per curve, the counts the
    engine settled on, the recovery time from 8 workers, and the straggler variant."""
    out = []
    for layout, lay in runs.groupby("layout", sort=False):
        clean = lay[lay.variant == "clean"].set_index(["job_type", "gpu", "mode"])
        keys = sorted({(j, g) for j, g, _ in clean.index})
        for mode in ("elastic", "value"):
            out += _versus_static(clean, keys, layout, mode)
        faulty = lay[lay.variant == "faults"].set_index(["job_type", "gpu", "mode"])
        for w in STATIC_COUNTS[1:]:
            gains = [
                _pct(
                    faulty.loc[(*k, f"replace{w}")].completion_s,
                    faulty.loc[(*k, f"static{w}")].completion_s,
                )
                for k in keys
            ]
            reps = sum(int(faulty.loc[(*k, f"replace{w}")].replacements) for k in keys)
            hit = sum(int(faulty.loc[(*k, f"static{w}")].stragglers) > 0 for k in keys)
            out.append(
                {
                    "layout": layout,
                    "comparison": f"stragglers: static{w} + replacement vs static{w}",
                    "completion_pct": _spread(gains),
                    "gpu_time_pct": f"{reps} replacements; {hit} static runs hit",
                    "n": len(keys),
                }
            )
        gains = [
            _pct(faulty.loc[(*k, "elastic")].completion_s, clean.loc[(*k, "elastic")].completion_s)
            for k in keys
        ]
        out.append(
            {
                "layout": layout,
                "comparison": "stragglers: elastic with faults vs without",
                "completion_pct": _spread(gains),
                "gpu_time_pct": "",
                "n": len(keys),
            }
        )
    out += _knee_rows()
    table = pd.DataFrame(out)
    table.loc[len(table)] = {
        "layout": "paper",
        "comparison": "ResNet-56/CIFAR-10 vs static (recovery 61-78 s)",
        "completion_pct": "-16.0 .. -8.2",
        "gpu_time_pct": "-85.1 .. -58.6",
        "n": 1,
    }
    incomplete = int((~runs.completed).sum())
    if incomplete:
        table.loc[len(table)] = {
            "layout": "all",
            "comparison": "runs that did not complete",
            "completion_pct": str(incomplete),
            "gpu_time_pct": "",
            "n": incomplete,
        }
    return table
