from django.apps import AppConfig


class TeamsConfig(AppConfig):
    name = "portal.teams"
    label = "teams"
    verbose_name = "Projects, quotas and accounting"
