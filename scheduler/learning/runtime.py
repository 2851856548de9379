"""Which trained interference model a policy uses, loaded once and cached (ALGORITHMS.md §2).

``resolve(spec)`` turns the ``model`` parameter of ``coscheml`` (and of the ``learned``
interference model) into an ``InterferencePredictor``:

- ``"active"`` (the default): the model the portal's staff activated. The portal registers a
  *provider* at start-up (``set_active_provider``): a function returning the active model's key
  (e.g. ``"db:12"``) and a loader of its bytes, or None when no model is active. The predictor
  is loaded when the key changes and kept otherwise, so every scheduling cycle gets the same
  object (and its prediction cache) until staff activate another model. Without a provider
  (the simulator, the benchmarks) or without an active model, ``"active"`` falls back to the
  built-in model.
- ``"builtin"``: a random forest trained on the shipped Gavel measurements (both families),
  seed 0; trained on first use in this process (a few seconds) and kept.
- ``"file:PATH"`` or a path ending in ``.model``: a model file written by
  ``python -m scheduler.learning train --out PATH`` or the portal's export.

Nothing here reads a clock; the provider (portal code) does the database read.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path

from scheduler.learning.predictor import InterferencePredictor, PredictorError, load, loads

#: A provider returns None (no active model) or (key, loader of the model's bytes).
Provider = Callable[[], tuple[str, Callable[[], bytes]] | None]

_lock = threading.Lock()
_provider: Provider | None = None
_active: tuple[str, InterferencePredictor] | None = None
_files: dict[str, tuple[float, InterferencePredictor]] = {}


def set_active_provider(provider: Provider | None) -> None:
    """Register (or, with None, remove) the function that names the active model."""
    global _provider, _active
    with _lock:
        _provider = provider
        _active = None


def active_provider() -> Provider | None:
    """The registered provider (None: none registered)."""
    return _provider


def active_key() -> str | None:
    """The active model's key as the provider names it, or None."""
    provider = _provider
    if provider is None:
        return None
    found = provider()
    return None if found is None else found[0]


def active_predictor() -> InterferencePredictor | None:
    """The active model (cached by key; reloaded when the key changes), or None."""
    global _active
    provider = _provider
    if provider is None:
        return None
    found = provider()
    if found is None:
        return None
    key, loader = found
    current = _active
    if current is not None and current[0] == key:
        return current[1]
    with _lock:
        if _active is not None and _active[0] == key:
            return _active[1]
        predictor = loads(loader())
        predictor.metadata.setdefault("key", key)
        _active = (key, predictor)
        return predictor


def forget_active() -> None:
    """Drop the cached active model (the next ``active_predictor`` reloads it)."""
    global _active
    with _lock:
        _active = None


@functools.lru_cache(maxsize=2)
def builtin_predictor(seed: int = 0) -> InterferencePredictor:
    """A random forest trained on the shipped Gavel data (tf and pytorch), cached."""
    from scheduler.learning.datasets import gavel_training_set
    from scheduler.learning.training import fit_predictor

    data = gavel_training_set()
    return fit_predictor(
        data, "forest", seed=seed, name="builtin-forest", metadata={"source": "builtin"}
    )


def _file_predictor(path: str) -> InterferencePredictor:
    try:
        mtime = Path(path).stat().st_mtime
    except OSError:
        raise PredictorError(f"{path}: no such model file") from None
    cached = _files.get(path)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    predictor = load(path)
    _files[path] = (mtime, predictor)
    return predictor


def resolve(spec: str | InterferencePredictor | None = "active") -> InterferencePredictor:
    """The predictor named by ``spec`` (see the module docstring)."""
    if isinstance(spec, InterferencePredictor):
        return spec
    spec = "active" if spec in (None, "") else str(spec)
    if spec == "active":
        return active_predictor() or builtin_predictor()
    if spec == "builtin":
        return builtin_predictor()
    if spec.startswith("file:"):
        return _file_predictor(spec[len("file:") :])
    if spec.endswith(".model") or "/" in spec:
        return _file_predictor(spec)
    raise PredictorError(
        f"unknown model {spec!r}: use 'active', 'builtin', 'file:PATH' or a path to a .model file"
    )
