"""Celery task of ``portal.replay`` (thin: load by id, call one service). Registered when Django
starts (``portal.replay.apps``); it runs on the default ``scheduler`` queue."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="cosched.replay_run", ignore_result=True, acks_late=True, time_limit=3600)
def replay_run(run_id: int) -> str:
    from portal.replay.services import replay_run_execute

    return replay_run_execute(run_id).status
