"""Celery task of ``portal.replay`` (thin: load by id, call one service). Registered when Django
starts (``portal.replay.apps``); it runs on the default ``scheduler`` queue. Its time limit is
``portal.replay.services.TASK_TIME_LIMIT_S``: a replay RUNNING for longer is taken up again. The
service enqueues it by name (``REPLAY_RUN_TASK``), so this module names the service and not the
other way round."""

from __future__ import annotations

from celery import shared_task

from portal.replay.services import REPLAY_RUN_TASK, TASK_TIME_LIMIT_S, replay_run_execute


@shared_task(name=REPLAY_RUN_TASK, ignore_result=True, acks_late=True, time_limit=TASK_TIME_LIMIT_S)
def replay_run(run_id: int) -> str:
    return replay_run_execute(run_id).status
