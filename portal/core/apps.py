from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "portal.core"
    label = "core"
    verbose_name = "Cosched"

    def ready(self) -> None:
        # Every Django process (web, management commands, tests) loads the Celery app here, so
        # `task.delay()` goes to the configured broker (or runs in-process in the embedded
        # default) and not to Celery's built-in default app. Kept out of portal/__init__.py so
        # that importing portal.cli does not pull in Django and Celery.
        import portal.celery  # noqa: F401
