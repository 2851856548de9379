"""``manage.py train_interference``: train, validate and register interference models.

    python manage.py train_interference                       # all four algorithms
    python manage.py train_interference --algorithm forest --activate forest
    python manage.py train_interference --validation cv5 --no-live --export var/forest.model

Trains on the Gavel measurements plus the live co-run samples (``--no-live``: without them),
validates each algorithm (5-fold, pairs held out, leave-one-application-out; ``--validation``
to choose), stores one model per algorithm in the registry (admin: Interference models) and
prints the scores beside the thesis'. ``--activate forest`` (or ``best``: lowest 5-fold MSE)
makes that model the one ``coscheml`` uses. A progress bar runs while it works (``--quiet``:
none). The same run shows its progress on the admin's training runs page.
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduler.learning.training import ALGORITHM_LABELS, ALGORITHMS, VALIDATIONS

THESIS = (
    "thesis 003 Table 2 (12 apps, 144 pairs, 5-fold CV): linear MSE 0.0546 R^2 0.6946, "
    "tree 0.0269 / 0.8500, forest 0.0222 / 0.8758 (interference = co-run / solo time)"
)


class Command(BaseCommand):
    help = "Train, validate and register Co-scheML interference models (docs/coscheml.md)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--algorithm", action="append", choices=ALGORITHMS, help="repeatable; default all"
        )
        parser.add_argument(
            "--validation", action="append", choices=VALIDATIONS, help="repeatable; default all"
        )
        parser.add_argument("--no-live", action="store_true", help="Gavel data only")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--activate",
            metavar="ALGORITHM|best",
            help="activate the model of this algorithm (best: lowest 5-fold MSE)",
        )
        parser.add_argument("--export", metavar="PATH", help="write the activated model to a file")
        parser.add_argument("--quiet", action="store_true", help="no progress bar")

    def handle(self, *args: Any, **opts: Any) -> None:
        from portal.ml import services
        from portal.ml.models import TrainingRun

        algorithms = opts["algorithm"] or list(ALGORITHMS)
        activate = opts["activate"]
        if activate and activate != "best" and activate not in algorithms:
            raise CommandError(
                f"--activate {activate}: not among the trained algorithms ({', '.join(algorithms)})"
            )
        if opts["export"] and not activate:
            raise CommandError("--export writes the activated model: give --activate too")
        try:
            run = services.training_run_create(
                algorithms=algorithms,
                validations=opts["validation"] or list(VALIDATIONS),
                include_live=not opts["no_live"],
                seed=opts["seed"],
                source=TrainingRun.Source.COMMAND,
            )
        except services.TrainingError as exc:
            raise CommandError(str(exc)) from None
        bar = None
        update = None
        if not opts["quiet"] and sys.stderr.isatty():
            from tqdm import tqdm

            bar = tqdm(total=1, unit="fit", file=sys.stderr, leave=False)

            def update(done: int, total: int, message: str) -> None:
                bar.total = total
                bar.set_description(message[:40])
                bar.update(done - bar.n)

        try:
            run = services.training_run_execute(run.pk, progress=update)
        except Exception as exc:
            raise CommandError(f"training run #{run.pk} failed: {exc}") from exc
        finally:
            if bar is not None:
                bar.close()
        models = list(run.models.defer("artifact").order_by("id"))
        first = models[0] if models else None
        if first is not None:
            self.stdout.write(
                f"training run #{run.pk}: data set {first.dataset_hash[:12]} {first.dataset}"
            )
        header = f"{'model':<22}{'validation':<11}{'n':>6}{'MSE':>9}{'R^2':>8}{'MAE':>8}"
        self.stdout.write(header)
        for model in models:
            for validation, s in (model.scores or {}).items():
                if not s.get("n"):
                    continue
                r2 = "-" if s.get("r2") is None else f"{s['r2']:.3f}"
                self.stdout.write(
                    f"{ALGORITHM_LABELS.get(model.algorithm, model.algorithm):<22}"
                    f"{validation:<11}{s['n']:>6}{s['mse']:>9.4f}{r2:>8}{s['mae']:>8.4f}"
                )
        self.stdout.write(THESIS)
        for model in models:
            self.stdout.write(f"proposed: {model.name} (id {model.pk})")
        if activate:
            chosen = self._choose(models, activate)
            services.model_activate(chosen)
            self.stdout.write(self.style.SUCCESS(f"activated {chosen.name}"))
            if opts["export"]:
                with open(opts["export"], "wb") as f:
                    f.write(services.model_export(chosen))
                self.stdout.write(f"wrote {opts['export']}")

    @staticmethod
    def _choose(models: list[Any], activate: str) -> Any:
        if activate == "best":
            scored = [m for m in models if m.score("cv5", "mse") is not None]
            if not scored:
                raise CommandError("--activate best needs the cv5 validation")
            return min(scored, key=lambda m: m.score("cv5", "mse"))
        for model in models:
            if model.algorithm == activate:
                return model
        raise CommandError(f"no {activate} model was trained")
