"""Celery task of ``portal.replay`` (thin: load by id, call one service). Registered when Django
starts (``portal.replay.apps``); it runs on the default ``scheduler`` queue. Its time limit is
``portal.replay.services.TASK_TIME_LIMIT_S``: a replay RUNNING for longer is taken up again."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="cosched.replay_run", ignore_result=True, acks_late=True, time_limit=3600)
def replay_run(run_id: int) -> str:
    from portal.replay.services import replay_run_execute

    return replay_run_execute(run_id).status
