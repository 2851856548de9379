"""Small display filters for the portal's templates."""

from __future__ import annotations

import json
import math
from typing import Any

from django import template

from portal.core.models import SHARING_MODES

register = template.Library()

MISSING = "—"


@register.filter
def metric(value: Any) -> str:
    """A measured number for display: "—" when unknown, no float noise, thousands grouped."""
    if value is None or value == "":
        return MISSING
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "∞"
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        return f"{value:,.3g}" if abs(value) < 1 else f"{value:,.2f}".rstrip("0").rstrip(".")
    return f"{value:,}"


@register.filter
def mb(value: Any) -> str:
    """Megabytes, shown in GB from 1 GB on (1024 MB = 1 GB, as nvidia-smi does)."""
    if value is None or value == "":
        return MISSING
    if value >= 1024:
        return f"{value / 1024:,.1f} GB"
    return f"{metric(value)} MB"


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@register.filter
def duration(seconds: Any) -> str:
    """A time limit as ``HH:MM:SS`` / ``D-HH:MM:SS`` (``scheduler.durations``)."""
    from scheduler.durations import format_duration

    try:
        return format_duration(float(seconds))
    except (TypeError, ValueError):
        return ""


@register.filter
def state_class(state: str) -> str:
    return f"state state-{str(state).lower()}"


_SHARING_LABELS = dict(SHARING_MODES)


@register.filter
def sharing_mode(value: str) -> str:
    """``time_slicing`` -> ``Time-slicing`` (unknown values are shown as they are)."""
    return _SHARING_LABELS.get(value, value)
