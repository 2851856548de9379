"""The Celery application. Settings come from Django's (``CELERY_*``).

Every message is signed JSON (``portal.core.signed_messages``): a worker runs only tasks the
portal sent, whoever else can write into Redis.
"""

import os
from typing import Any

from celery import Celery, Task
from celery.exceptions import InvalidTaskError
from celery.worker.request import Request

from portal.core.signed_messages import register_serializer

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
register_serializer()

# What a message's (unsigned) headers may not change: Celery lets headers override the body.
_SIGNED_FIELDS = ("task", "id", "eta", "expires", "shadow", "timelimit", "retries")


class SignedRequest(Request):
    """A task request whose name, id and timing are those of the message's signed body: a
    signed body copied into a message whose headers name another task (or add a delay) is
    refused, not run."""

    def __init__(self, message: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(message, *args, **kwargs)
        signed = message.payload  # decoded (and its signature checked) by our serializer
        if not isinstance(signed, dict) or "task" not in signed:
            raise InvalidTaskError("not a signed task message")
        for field in _SIGNED_FIELDS:
            if field in signed and _same(signed[field]) != _same(self._request_dict.get(field)):
                raise InvalidTaskError(f"the message's {field} differs from its signed body")
        if self._request_dict.get("task") != signed["task"]:
            raise InvalidTaskError("the message's task differs from its signed body")


def _same(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


class SignedTask(Task):
    Request = "portal.celery:SignedRequest"
    abstract = True


app = Celery("cosched", task_cls=SignedTask)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"])
