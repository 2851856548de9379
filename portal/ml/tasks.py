"""Celery tasks of ``portal.ml`` (thin: load by id, call one service). Registered when Django
starts (``portal.ml.apps``); they run on the default ``scheduler`` queue. The services enqueue
them by name (``TRAIN_RUN_TASK``), so this module names the services and not the other way round.
"""

from __future__ import annotations

from celery import shared_task

from portal.ml.services import (
    TRAIN_RUN_TASK,
    corun_samples_collect,
    retrain_propose,
    training_run_execute,
)


@shared_task(name=TRAIN_RUN_TASK, ignore_result=True, acks_late=True, time_limit=3600)
def train_run(run_id: int) -> str:
    return training_run_execute(run_id).status


@shared_task(name="cosched.ml_collect_coruns", ignore_result=True)
def collect_coruns() -> int:
    return corun_samples_collect()


@shared_task(name="cosched.ml_retrain", ignore_result=True)
def retrain() -> int | None:
    run = retrain_propose()
    return None if run is None else run.pk
