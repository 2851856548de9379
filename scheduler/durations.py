"""Job time limits: the one parser of duration text (issue 18, "time limits").

Accepted forms (Slurm's ``--time`` forms, plus unit suffixes), always a whole number of seconds:

- plain seconds: ``90``, ``3600`` (an integer; **not** minutes as in Slurm: the API's other
  durations are seconds too);
- a number with a unit: ``90s``, ``30m``, ``2h``, ``1d`` (``1.5h`` too: the result is rounded to
  the second);
- clock forms: ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS`` (``1-00:00:00``
  is a day), as ``sbatch --time`` reads them.

Every limit is between ``MIN_S`` (1 s) and ``MAX_S`` (366 days). ``parse_duration`` raises
``DurationError`` with a message that names the accepted forms; ``format_duration`` writes the
canonical ``D-HH:MM:SS`` / ``HH:MM:SS`` form back. Pure Python: the API, the browser form, the
command line and the scheduler all use it.
"""

from __future__ import annotations

import math
import re

MIN_S = 1
MAX_S = 366 * 24 * 3600  # a year and a day: far beyond any job, far inside every integer type

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_WITH_UNIT = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_CLOCK = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
FORMS = "seconds (90), a number with a unit (90s, 30m, 2h, 1d) or [D-]HH:MM:SS (1-00:00:00)"


class DurationError(ValueError):
    """A time limit that cannot be read or is out of bounds; the text says which and why."""


def parse_duration(value: object) -> int:
    """Seconds of ``value`` (an int, or text in one of the module docstring's forms)."""
    if isinstance(value, bool):
        raise DurationError(f"expected a duration: {FORMS}")
    if isinstance(value, int):
        return _bounded(value, str(value))
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise DurationError(f"{value!r} is not a whole number of seconds; give {FORMS}")
        return _bounded(int(value), str(value))
    if not isinstance(value, str):
        raise DurationError(f"expected a duration: {FORMS}")
    text = value.strip().lower()
    if not text:
        raise DurationError(f"empty; give {FORMS}")
    if len(text) > 40:
        raise DurationError(f"too long to be a duration; give {FORMS}")
    if text.isdigit():
        return _bounded(int(text), value.strip())
    match = _WITH_UNIT.fullmatch(text)
    if match:
        number, unit = match.groups()
        return _bounded(round(float(number) * _UNITS[unit]), value.strip())
    match = _CLOCK.fullmatch(text)
    if match and (":" in text or "-" in text):
        return _bounded(_clock_seconds(text, *match.groups()), value.strip())
    raise DurationError(f"{value.strip()[:40]!r} is not a duration; give {FORMS}")


def _clock_seconds(
    text: str, days: str | None, first: str, second: str | None, third: str | None
) -> int:
    numbers = [int(x) for x in (first, second, third) if x is not None]
    if days is not None:
        # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = (numbers + [0, 0])[:3]
        total = int(days) * 86400
    elif len(numbers) == 2:
        hours, (minutes, seconds) = 0, numbers  # MM:SS
        total = 0
    else:
        hours, minutes, seconds = numbers  # HH:MM:SS
        total = 0
    # The leading field may be large (``90:00`` is 90 minutes, ``36:00:00`` 36 hours, as in
    # Slurm); the fields after it are clock fields.
    minutes_lead = days is None and len(numbers) == 2
    if seconds >= 60 or (minutes >= 60 and not minutes_lead) or (days is not None and hours >= 24):
        raise DurationError(
            f"{text!r}: a clock field after the first goes up to 59 (hours up to 23 after a day "
            "count)"
        )
    return total + hours * 3600 + minutes * 60 + seconds


def _bounded(seconds: int, text: str) -> int:
    if seconds < MIN_S:
        raise DurationError(f"{text!r} is {seconds} s; a time limit is at least {MIN_S} s")
    if seconds > MAX_S:
        raise DurationError(
            f"{text!r} is longer than {format_duration(MAX_S)} ({MAX_S:,} s), the longest time "
            "limit"
        )
    return seconds


def format_duration(seconds: float | None) -> str:
    """``HH:MM:SS``, or ``D-HH:MM:SS`` from a day on ("" for None): what ``sacct`` shows."""
    if seconds is None:
        return ""
    total = max(0, int(round(seconds)))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock
