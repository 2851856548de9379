"""Command line of the interference models (docs/coscheml.md):

    python -m scheduler.learning scores [--algorithm A ...] [--validation V ...] [--json FILE]
    python -m scheduler.learning train --out FILE.model [--algorithm forest]
    python -m scheduler.learning holdout [--fraction 0.25] [--seed 0] [--scenario philly]

``scores`` prints MSE, R^2 and MAE of every algorithm under every validation on the Gavel data
(the thesis' Table 2 beside ours); ``train`` fits one model on all of it (validated first unless
``--no-validate``) and writes it where ``coscheml``'s ``model`` parameter can name it;
``holdout`` is the held-out-pairs experiment. A progress bar runs on stderr when it is a
terminal (``--quiet`` turns it off). Bad arguments print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from scheduler.learning.datasets import DatasetError
from scheduler.learning.predictor import PredictorError, save
from scheduler.learning.training import ALGORITHMS, VALIDATIONS

THESIS = (
    "thesis 003 Table 2 (12 apps, 144 pairs, 5-fold CV, interference = co-run/solo time): "
    "linear MSE 0.0546 R^2 0.6946; tree MSE 0.0269 R^2 0.8500; forest MSE 0.0222 R^2 0.8758"
)


def _bar(total: int, quiet: bool) -> tuple[Any, Callable[[int, int, str], None]]:
    if quiet or not sys.stderr.isatty():
        return None, lambda done, total, message: None
    from tqdm import tqdm  # type: ignore[import-untyped]  # tqdm ships no type hints

    bar = tqdm(total=total, file=sys.stderr, unit="fit", leave=False)

    def update(done: int, total: int, message: str) -> None:
        bar.total = total
        bar.set_description(message[:40])
        bar.update(done - bar.n)

    return bar, update


def _scores(args: argparse.Namespace) -> int:
    from scheduler.learning.evaluate import score_table, train_and_score

    bar, update = _bar(1, args.quiet)
    try:
        report = train_and_score(
            algorithms=args.algorithm or ALGORITHMS,
            validations=args.validation or VALIDATIONS,
            seed=args.seed,
            progress=update,
            fit_final=False,
        )
    finally:
        if bar is not None:
            bar.close()
    print(f"data set {report.dataset_hash[:12]}: {report.dataset}")
    table = score_table(report.scores)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(f"feasibility classifier (5-fold): {report.feasibility}")
    print(THESIS)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "dataset": report.dataset,
                    "hash": report.dataset_hash,
                    "scores": report.scores,
                    "feasibility": report.feasibility,
                },
                f,
                indent=2,
                default=str,
            )
    return 0


def _train(args: argparse.Namespace) -> int:
    from scheduler.learning.datasets import gavel_training_set
    from scheduler.learning.training import fit_predictor, train_models

    data = gavel_training_set()
    if args.no_validate:
        predictor = fit_predictor(data, args.algorithm, seed=args.seed)
    else:
        bar, update = _bar(1, args.quiet)
        try:
            report = train_models(data, [args.algorithm], seed=args.seed, progress=update)
        finally:
            if bar is not None:
                bar.close()
        predictor = report.predictors[args.algorithm]
    save(predictor, args.out)
    print(f"wrote {args.out}: {predictor.summary()}, data set {data.digest()[:12]}")
    return 0


def _holdout(args: argparse.Namespace) -> int:
    from scheduler.learning.evaluate import holdout_experiment
    from scheduler.simulate import format_table

    def say(text: str) -> None:
        if not args.quiet:
            print(f"... {text}", file=sys.stderr)

    result = holdout_experiment(
        fraction=args.fraction,
        seed=args.seed,
        scenario=args.scenario,
        extra_min_feasible=args.min_feasible or (),
        scenario_pairs=args.scenario_pairs,
        progress=say,
    )
    mae = result["mae"]
    how = "the scenario's own" if args.scenario_pairs else f"a random {args.fraction:g} of the"
    print(
        f"held out {mae['pairs']} pairs: {how} PyTorch job-type pairs (seed {args.seed}); "
        f"trained on {result['training']}"
    )
    print(
        f"held-out samples {mae['n']} (feasible, on {', '.join(mae['gpus'])}): "
        f"MAE {mae['mae']:.4f}, MSE {mae['mse']:.4f}, R^2 {mae['r2']:.3f} "
        f"(normalised throughput); {mae['infeasible_samples']} infeasible samples held out"
    )
    print(f"scenario {result['scenario']}, ground truth: the measured table")
    print(format_table(result["summary"]))
    for label, (hits, total) in result["held_out_pairings"].items():
        print(f"{label}: {hits} of {total} pairings were held-out type pairs")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scheduler.learning", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("scores", help="validate every algorithm (Table 2)")
    s.add_argument("--algorithm", action="append", choices=ALGORITHMS)
    s.add_argument("--validation", action="append", choices=VALIDATIONS)
    s.add_argument("--json", help="also write the scores as JSON")
    t = sub.add_parser("train", help="fit one model and write it to a file")
    t.add_argument("--algorithm", default="forest", choices=ALGORITHMS)
    t.add_argument("--out", required=True, help="model file to write (e.g. var/interference.model)")
    t.add_argument("--no-validate", action="store_true", help="skip the validation runs")
    h = sub.add_parser("holdout", help="the held-out-pairs experiment")
    h.add_argument("--fraction", type=float, default=0.25, help="share of pairs held out")
    h.add_argument("--scenario", default="philly", help="scenario to replay (default philly)")
    h.add_argument(
        "--scenario-pairs",
        action="store_true",
        help="hold out every pair of the scenario's job types instead of a random fraction",
    )
    h.add_argument(
        "--min-feasible",
        type=float,
        action="append",
        help="also run coscheml with this feasibility threshold (repeatable)",
    )
    for q in (s, t, h):
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "holdout" and not 0 < args.fraction < 1:
        print("error: --fraction must be between 0 and 1", file=sys.stderr)
        return 2
    try:
        return {"scores": _scores, "train": _train, "holdout": _holdout}[args.command](args)
    except (DatasetError, PredictorError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
