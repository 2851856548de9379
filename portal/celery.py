"""The Celery application. Settings come from Django's (``CELERY_*``).

Every message is signed JSON (``portal.core.signed_messages``): a worker runs only tasks the
portal sent, whoever else can write into Redis.
"""

import os
from typing import Any

from celery import Celery, Task

from portal.core.signed_messages import register_serializer

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
register_serializer()


class SignedTask(Task):
    """Runs only under the name its signed message body gives: headers are not signed, so a
    signed body under another task's name in a forged header runs nothing."""

    abstract = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if not request.called_directly and not request.is_eager:
            signed = getattr(request, "task", None)
            if signed != self.name:
                raise PermissionError(
                    f"message for task {signed!r} delivered as {self.name!r}: not run"
                )
        return super().__call__(*args, **kwargs)


app = Celery("cosched", task_cls=SignedTask)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"])
