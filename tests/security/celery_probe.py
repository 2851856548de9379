"""Tasks a test worker loads (``celery worker -I tests.security.celery_probe``) so that the
Redis attack test can see whether a message ran: each writes the file it is given."""

from __future__ import annotations

from pathlib import Path

from celery import shared_task


@shared_task(name="cosched.test_probe", ignore_result=True)
def probe(path: str) -> None:
    Path(path).write_text("ran\n")


@shared_task(name="cosched.test_harmless", ignore_result=True)
def harmless(path: str) -> None:
    """Does nothing with ``path``: a signed message for it must not run ``probe``."""
