from django.apps import AppConfig


class MlConfig(AppConfig):
    name = "portal.ml"
    label = "ml"
    verbose_name = "Interference models (Co-scheML)"

    def ready(self) -> None:
        # The scheduler's ``coscheml`` policy (pure core) asks this provider which trained model
        # is active; the predictor is cached by the model's key (scheduler.learning.runtime).
        from portal.ml import tasks  # noqa: F401  (registers the Celery tasks)
        from portal.ml.selectors import active_model_provider
        from scheduler.learning.runtime import set_active_provider

        set_active_provider(active_model_provider)
