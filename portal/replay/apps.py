from django.apps import AppConfig


class ReplayConfig(AppConfig):
    name = "portal.replay"
    label = "replay"
    verbose_name = "What-if replay"

    def ready(self) -> None:
        from portal.replay import tasks  # noqa: F401  (registers the Celery task)
