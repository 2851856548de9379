"""Cosched scheduling core: pure Python, no Django, Celery or Redis (see DESIGN.md)."""
