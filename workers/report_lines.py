"""The machine-readable lines a job prints for its node agent.

One report per line, mixed freely with the job's own output (which the agent ignores)::

    @cosched <event> key=value key=value ...

``event`` is a word; values contain no spaces and are read back as int, then float, else str.
``iter=42/100`` style values are not used: counts and totals are separate keys. Events written by
``workers.emulate`` (the training SDK may add more; readers must ignore unknown events and keys):

- ``start``: ``profile``, ``gpu_model`` (or ``none``), ``solo_s``, ``scale``, ``run_s`` (active
  seconds the run will take), ``iters``, ``epochs``, ``steps``, ``pid``, ``resumed_from``
  (fraction of the work a checkpoint of an earlier attempt had saved; 0 for a fresh start)
- ``progress``: ``fraction`` (0..1 of the work), ``iter`` and ``iters`` (done / total),
  ``iter_time_s`` (mean active seconds per iteration in the current epoch, over at least the
  last few completed iterations; see ``workers.emulate``), ``step``
  (1-based memory step, 0 = none), ``mem_mb`` (memory the job holds now, MB), ``active_s``
  (seconds of work done, pauses excluded), ``elapsed_s`` (wall seconds since start, pauses included)
- ``epoch``: ``epoch`` (1-based index just finished), ``epochs``, ``iter``, ``iters``,
  ``iter_time_s`` (mean over the epoch), ``elapsed_s``
- ``done``: ``iters``, ``active_s``, ``elapsed_s``
- ``fail``: ``fraction``, ``exit_code``
- ``term``: ``fraction``, ``signal`` (e.g. ``SIGTERM``), ``exit_code``
- ``checkpoint``: ``fraction`` saved in ``$COSCHED_CHECKPOINT_DIR``, ``attempt``

**Any program** may report its progress the same way, in a short form::

    @cosched progress 0.25 steps=300

the fraction of its work done (0..1) as the first word, and optionally ``steps=N``, the
application steps (iterations, mini-batches) done so far. The node agent sends both to the
portal, which measures the job's throughput from them (docs/profiles.md, "Measured on the
cluster"); ``workers.sdk`` prints this line from ``report()`` when it knows the total.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PREFIX = "@cosched"


@dataclass(frozen=True, slots=True)
class Report:
    """One parsed report line."""

    event: str
    fields: Mapping[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


def _value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            continue
    return text


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e6 else f"{value:.1f}"
    text = str(value)
    if not text or any(c.isspace() for c in text):
        raise ValueError(f"report values may not be empty or contain spaces: {text!r}")
    return text


def format_report(event: str, **fields: Any) -> str:
    """The report line (no newline) for ``event`` with ``fields`` in the given order."""
    parts = [PREFIX, event, *(f"{k}={_text(v)}" for k, v in fields.items())]
    return " ".join(parts)


def parse_report(line: str) -> Report | None:
    """The report on ``line``, or None if the line is not one (ordinary job output)."""
    tokens = line.strip().split()
    if len(tokens) < 2 or tokens[0] != PREFIX:
        return None
    fields: dict[str, Any] = {}
    for n, token in enumerate(tokens[2:]):
        key, sep, raw = token.partition("=")
        if sep and key:
            fields[key] = _value(raw)
        elif n == 0 and tokens[1] == "progress" and isinstance(_value(token), (int, float)):
            fields["fraction"] = _value(token)  # ``@cosched progress 0.25 steps=300``
    return Report(tokens[1], fields)
