"""The experiments of docs/coscheml.md, as functions (the command line is ``__main__``).

- ``score_table``: every algorithm under every validation on the Gavel data (thesis Table 2).
- ``holdout_experiment``: hold out a share of the PyTorch job-type pairs of ``colocation.csv``
  from training; report the MAE of the predicted normalised throughput on them, then replay a
  Gavel trace with the measured table as the simulator's ground truth under ``coscheml`` with
  that model, under ``coscheml`` fed the measured pairs themselves (``predictor: measured``, an
  upper bound) and under the baselines.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints

from scheduler.learning.datasets import (
    COLOCATION_CSV,
    REFERENCE_JOB_TYPES,
    TrainingSet,
    gavel_training_set,
    pytorch_samples,
)
from scheduler.learning.features import gpu_vector
from scheduler.learning.predictor import InterferencePredictor
from scheduler.learning.training import (
    ALGORITHM_LABELS,
    ALGORITHMS,
    VALIDATIONS,
    Progress,
    fit_predictor,
    scores,
    train_models,
)

_PARTNER = re.compile(r"^paired with job (\S+) ")


def score_table(report_scores: dict[str, dict[str, dict[str, Any]]]) -> pd.DataFrame:
    """One row per (algorithm, validation): n, MSE, R^2, MAE, slowdown MSE and R^2, and the
    per-family MSE / R^2."""
    rows = []
    for algorithm, per in report_scores.items():
        for validation, s in per.items():
            row = {
                "model": ALGORITHM_LABELS.get(algorithm, algorithm),
                "validation": validation,
                "n": s.get("n", 0),
                "mse": s.get("mse"),
                "r2": s.get("r2"),
                "mae": s.get("mae"),
                "slowdown_mse": s.get("slowdown_mse"),
                "slowdown_r2": s.get("slowdown_r2"),
            }
            for fam, fs in (s.get("by_family") or {}).items():
                row[f"{fam}_mse"] = fs.get("mse")
                row[f"{fam}_r2"] = fs.get("r2")
            rows.append(row)
    return pd.DataFrame(rows)


def pytorch_pairs(exclude_references: bool = True) -> list[frozenset[str]]:
    """Every unordered pair (self pairs included) of the PyTorch job types of
    ``colocation.csv``, sorted; without the reference job types by default."""
    frame = pd.read_csv(COLOCATION_CSV, usecols=["job_a", "job_b"])
    types = sorted(set(frame["job_a"]) | set(frame["job_b"]))
    if exclude_references:
        types = [t for t in types if t not in REFERENCE_JOB_TYPES]
    pairs = {frozenset((a, b)) for i, a in enumerate(types) for b in types[i:]}
    return sorted(pairs, key=lambda p: tuple(sorted(p)))


def split_pairs(fraction: float, seed: int) -> list[frozenset[str]]:
    """``fraction`` of ``pytorch_pairs()`` drawn with ``random.Random(seed)``: the held-out set."""
    pairs = pytorch_pairs()
    k = max(1, round(fraction * len(pairs)))
    return sorted(random.Random(seed).sample(pairs, k), key=lambda p: tuple(sorted(p)))


def holdout_model(
    held_out: Sequence[frozenset[str]], *, algorithm: str = "forest", seed: int = 0
) -> tuple[InterferencePredictor, TrainingSet]:
    """A model trained on the Gavel data without ``held_out`` pairs, and the training set."""
    data = gavel_training_set(exclude_pairs=held_out)
    return fit_predictor(data, algorithm, seed=seed, name=f"holdout-{algorithm}"), data


def holdout_mae(predictor: InterferencePredictor, held_out: Sequence[frozenset[str]]) -> dict:
    """Scores of ``predictor`` on every feasible sample of the ``held_out`` pairs."""
    samples = [s for s in pytorch_samples(only_pairs=held_out) if s.norm is not None]
    pairs = [
        (
            predictor.job_vector(s.a, s.type_a),
            predictor.job_vector(s.b, s.type_b),
            gpu_vector(s.gpu),
        )
        for s in samples
    ]
    predicted = np.array([norm for norm, _ in predictor.predict(pairs)])
    truth = np.array([s.norm for s in samples], dtype=float)
    out = scores(truth, predicted)
    out["pairs"] = len(held_out)
    out["gpus"] = sorted({s.gpu.model for s in samples})
    infeasible = [s for s in pytorch_samples(only_pairs=held_out) if s.norm is None]
    out["infeasible_samples"] = len(infeasible)
    return out


def held_out_share(result: Any, held_out: Sequence[frozenset[str]]) -> tuple[int, int]:
    """(co-locations of held-out type pairs, all co-locations) decided by a coscheml run."""
    frame = result.jobs_frame()
    types = dict(zip(frame["job_id"].astype(str), frame["job_type"], strict=True))
    held = set(held_out)
    total = hits = 0
    for job_type, text in zip(frame["job_type"], frame["explanation"].fillna(""), strict=True):
        match = _PARTNER.match(str(text))
        if match is None:
            continue
        total += 1
        if frozenset((job_type, types.get(match.group(1), ""))) in held:
            hits += 1
    return hits, total


def holdout_experiment(
    *,
    fraction: float = 0.25,
    seed: int = 0,
    scenario: str = "philly",
    baselines: Sequence[str] = ("fifo", "binpack", "loadbalance", "random", "mystic"),
    extra_min_feasible: Sequence[float] = (),
    scenario_pairs: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The held-out-pairs experiment (module docstring). Returns the held-out pairs, the MAE
    scores, the simulation summary (a DataFrame) and how many coscheml pairings were pairs it
    had never seen. ``extra_min_feasible``: also run coscheml with these feasibility
    thresholds (a sensitivity check). ``scenario_pairs``: hold out every pair of the scenario's
    own job types (but the reference types) instead of a random ``fraction``."""
    from scheduler.interference import build_interference
    from scheduler.metrics import summarize
    from scheduler.policies.registry import build_policy
    from scheduler.scenarios import load_scenario
    from scheduler.simulator import simulate

    def say(text: str) -> None:
        if progress is not None:
            progress(text)

    sc = load_scenario(scenario)
    if scenario_pairs:
        types = sorted({j.job_type for j in sc.jobs if j.job_type} - set(REFERENCE_JOB_TYPES))
        held_out = [p for p in pytorch_pairs() if p <= set(types)]
    else:
        held_out = split_pairs(fraction, seed)
    say(f"training without {len(held_out)} held-out pairs")
    predictor, data = holdout_model(held_out, seed=seed)
    mae = holdout_mae(predictor, held_out)
    truth = build_interference(sc.interference)
    runs: list[tuple[str, Any]] = [
        ("coscheml (held-out model)", build_policy("coscheml", {"model": predictor})),
    ]
    for threshold in extra_min_feasible:
        runs.append(
            (
                f"coscheml (held-out, min_feasible {threshold:g})",
                build_policy("coscheml", {"model": predictor, "min_feasible": threshold}),
            )
        )
    runs.append(("coscheml (measured pairs)", build_policy("coscheml", {"predictor": "measured"})))
    runs += [(name, build_policy(name, sc.policy_params.get(name))) for name in baselines]
    rows = []
    share = {}
    for label, policy in runs:
        say(f"simulating {label}")
        result = simulate(sc.cluster, sc.jobs, policy, interference=truth, config=sc.config)
        row = summarize(result)
        row["policy"] = label
        rows.append(row)
        if label.startswith("coscheml"):
            share[label] = held_out_share(result, held_out)
    return {
        "held_out": held_out,
        "training": data.describe(),
        "mae": mae,
        "scenario": sc.name,
        "summary": pd.DataFrame(rows),
        "held_out_pairings": share,
    }


def train_and_score(
    *,
    algorithms: Sequence[str] = ALGORITHMS,
    validations: Sequence[str] = VALIDATIONS,
    seed: int = 0,
    progress: Progress | None = None,
    fit_final: bool = True,
) -> Any:
    """``train_models`` on the full Gavel training set."""
    return train_models(
        gavel_training_set(),
        algorithms,
        validations,
        seed=seed,
        progress=progress,
        fit_final=fit_final,
    )
