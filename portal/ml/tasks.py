"""Celery tasks of ``portal.ml`` (thin: load by id, call one service). Registered when Django
starts (``portal.ml.apps``); they run on the default ``scheduler`` queue."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="cosched.ml_train_run", ignore_result=True, acks_late=True, time_limit=3600)
def train_run(run_id: int) -> str:
    from portal.ml.services import training_run_execute

    return training_run_execute(run_id).status


@shared_task(name="cosched.ml_collect_coruns", ignore_result=True)
def collect_coruns() -> int:
    from portal.ml.services import corun_samples_collect

    return corun_samples_collect()


@shared_task(name="cosched.ml_retrain", ignore_result=True)
def retrain() -> int | None:
    from portal.ml.services import retrain_propose

    run = retrain_propose()
    return None if run is None else run.pk
