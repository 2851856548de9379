"""Cosched portal: the Django project (settings, urls, Celery app) and its apps.

Importing ``portal`` stays light on purpose: the ``cosched`` CLI (``portal.cli``) lives here and
must run without Django or Celery. Django processes load the Celery app in
``portal.core.apps.CoreConfig.ready``; the ``celery -A portal`` command finds it in
``portal.celery`` by itself.
"""
