from django.apps import AppConfig


class FrontConfig(AppConfig):
    name = "portal.front"
    label = "front"
