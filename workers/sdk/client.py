"""The training SDK's client: a job reports its iterations and epoch ends to the portal over
HTTP and reads back its data ratio and worker count. Standard library only; no Django.

The portal gives every attempt of a job two variables (``workers.agent`` / the portal's
``AttemptSpec.env``):

- ``COSCHED_API_URL``: the portal's base URL (``http://host:port``);
- ``COSCHED_JOB_TOKEN``: a token valid for this attempt only (``cjt_...``); the portal refuses
  a forged one with 401 and the token of an ended attempt with 403.

Without them (a job started outside Cosched, or a portal that gives none) the client is
disabled: ``report`` only keeps time locally and the ratio stays what the job started with.
A job never needs broker or database credentials.

Wire format (``POST {COSCHED_API_URL}/api/v1/training/report/``, ``Authorization: Bearer
<token>``, JSON): ``iteration`` (required), ``epoch``, ``epoch_end``, ``iterations_total``,
``iter_time_s`` (mean of the epoch), ``elapsed_s`` (since the client was created),
``slowdown``, ``data_ratio``. The reply is a JSON object with at least ``data_ratio`` (tenths
per GPU index of the node), ``workers``, ``epoch``, ``slowdown``, ``changed`` and
``explanation``; unknown keys are kept in ``Reply.raw`` (new features add keys).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("cosched.sdk")

# Names of variables and a prefix, not secrets (S105).
TOKEN_ENV = "COSCHED_JOB_TOKEN"  # noqa: S105
URL_ENV = "COSCHED_API_URL"
JOB_TOKEN_PREFIX = "cjt_"  # noqa: S105
REPORT_PATH = "/api/v1/training/report/"
ELASTIC_PATH = "/api/v1/training/elastic/"
RATIO_TOTAL = 10
PROGRESS_EVERY_S = 1.0  # at most one progress line a second (``TrainingClient.report``)


class SdkError(RuntimeError):
    """The portal refused a report (``status``: the HTTP status, 0 when it was not reached)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status


@dataclass(frozen=True)
class Reply:
    """The portal's answer to an epoch-end report."""

    data_ratio: tuple[int, ...]
    workers: int
    epoch: int
    slowdown: float | None = None
    changed: bool = False
    explanation: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Reply:
        ratio = data.get("data_ratio") or ()
        return cls(
            data_ratio=tuple(int(v) for v in ratio),
            workers=int(data.get("workers") or 1),
            epoch=int(data.get("epoch") or 0),
            slowdown=None if data.get("slowdown") is None else float(data["slowdown"]),
            changed=bool(data.get("changed")),
            explanation=str(data.get("explanation") or ""),
            raw=dict(data),
        )


def split_batch(global_batch: int, ratios: Sequence[int | float]) -> list[int]:
    """Per-device batch sizes for ``global_batch`` items split by ``ratios`` (e.g. the data
    ratio ``[0, 7, 3, 0]``): proportional, whole numbers, adding up to ``global_batch``
    exactly (largest remainder; ties go to the lower index). A device with ratio 0 gets 0."""
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 0:
        raise ValueError(f"global_batch must be a non-negative integer, got {global_batch!r}")
    weights = [float(r) for r in ratios]
    if not weights or any(w < 0 or w != w for w in weights) or sum(weights) <= 0:
        raise ValueError(f"ratios must be non-negative with a positive sum, got {list(ratios)!r}")
    total = sum(weights)
    exact = [w / total * global_batch for w in weights]
    sizes = [int(x) for x in exact]
    missing = global_batch - sum(sizes)
    order = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - sizes[i]), i))
    for i in order[:missing]:
        sizes[i] += 1
    return sizes


def split_tensor(batch: Any, ratios: Sequence[int | float], dim: int = 0) -> list[Any]:
    """A PyTorch tensor (anything with ``shape`` and ``split(sizes, dim)``) cut along ``dim``
    into per-device pieces by ``ratios`` (``split_batch`` sizes; a device with ratio 0 gets an
    empty piece). Torch is not imported here."""
    sizes = split_batch(int(batch.shape[dim]), ratios)
    return list(batch.split(sizes, dim))


class TrainingClient:
    """Reports to the portal (see the module docstring). ``report`` is cheap between epoch
    ends (local bookkeeping only); an epoch end makes one HTTP request.

    ``data_ratio`` and ``workers`` hold what the job should use; they change only when an
    epoch-end reply says so, so a job applies a new ratio from its next epoch. A portal that
    cannot be reached keeps the current values (the job goes on); a refused token (401/403)
    disables the client (``last_error`` says why) unless ``strict``, which raises SdkError.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        iterations_total: int | None = None,
        data_ratio: Sequence[int] | None = None,
        timeout_s: float = 5.0,
        strict: bool = False,
        clock: Callable[[], float] = time.monotonic,
        environ: Mapping[str, str] | None = None,
        progress_lines: bool = True,
    ) -> None:
        env = os.environ if environ is None else environ
        self.url = (url if url is not None else env.get(URL_ENV, "")).rstrip("/")
        self.token = token if token is not None else env.get(TOKEN_ENV, "")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"{URL_ENV} must be an http(s) URL, got {self.url!r}")
        self.enabled = bool(self.url and self.token)
        self.iterations_total = iterations_total
        self.data_ratio: tuple[int, ...] = tuple(data_ratio or ())
        self.workers: int | None = None
        self.timeout_s = timeout_s
        self.strict = strict
        self.clock = clock
        self.last_error: str = ""
        self.last_reply: Reply | None = None
        self.epoch = 0
        # The job's clock starts with its client (create it before the first iteration).
        self._t0 = self._epoch_t0 = clock()
        self._epoch_iter0 = 0
        # ``report`` prints progress lines (workers.report_lines) unless told not to.
        self.progress_lines = progress_lines
        self._progress_at = -math.inf

    def report(
        self,
        iteration: int,
        epoch_end: bool = False,
        *,
        epoch: int | None = None,
        iterations_total: int | None = None,
        slowdown: float | None = None,
    ) -> Reply | None:
        """Iteration ``iteration`` (the count done so far) ended; at an epoch end publish SD,
        data ratio and epoch and return the portal's reply (None when disabled/unreachable)."""
        now = self.clock()
        if iterations_total is not None:
            self.iterations_total = iterations_total
        self._print_progress(iteration, now, force=epoch_end)
        if not epoch_end:
            return None
        done = iteration - self._epoch_iter0
        iter_time = (now - self._epoch_t0) / done if done > 0 else None
        # ``epoch``: epochs completed (1 at the first epoch end), unless the job says.
        self.epoch = epoch if epoch is not None else self.epoch + 1
        body: dict[str, Any] = {
            "iteration": iteration,
            "epoch": self.epoch,
            "epoch_end": True,
            "elapsed_s": now - self._t0,
        }
        if iter_time is not None and iter_time > 0:
            body["iter_time_s"] = iter_time
        if self.iterations_total is not None:
            body["iterations_total"] = self.iterations_total
        if slowdown is not None:
            body["slowdown"] = slowdown
        if self.data_ratio:
            body["data_ratio"] = list(self.data_ratio)
        self._epoch_t0, self._epoch_iter0 = now, iteration
        if not self.enabled:
            return None
        reply = self._post(body)
        if reply is not None:
            self.last_reply = reply
            if reply.data_ratio:
                self.data_ratio = reply.data_ratio
            self.workers = reply.workers
        return reply

    def fetch(self, iteration: int = 0) -> Reply | None:
        """Ask for the current data ratio and worker count without ending an epoch (at start,
        or when another feature wants them now). None when disabled or unreachable."""
        if not self.enabled:
            return None
        body: dict[str, Any] = {"iteration": iteration, "epoch": self.epoch}
        if self.iterations_total is not None:
            body["iterations_total"] = self.iterations_total
        reply = self._post(body)
        if reply is not None:
            self.last_reply = reply
            if reply.data_ratio:
                self.data_ratio = reply.data_ratio
            self.workers = reply.workers
        return reply

    def split(self, global_batch: int) -> list[int]:
        """``split_batch`` by the current data ratio (the whole batch on one device without one)."""
        return split_batch(global_batch, self.data_ratio or [RATIO_TOTAL])

    def _print_progress(self, iteration: int, now: float, *, force: bool = False) -> None:
        """``@cosched progress <fraction> steps=<iteration>`` on stdout (at most one a
        second, and at every epoch end) when the total is known: the node agent reads it, and
        the portal measures the job's throughput from it (workers.report_lines)."""
        total = self.iterations_total
        if not self.progress_lines or not total or total <= 0:
            return
        if not force and now - self._progress_at < PROGRESS_EVERY_S:
            return
        self._progress_at = now
        fraction = min(1.0, max(0.0, iteration / total))
        print(f"@cosched progress {fraction:.6g} steps={int(iteration)}", flush=True)

    def report_window(
        self,
        workers: int,
        batches: int,
        seconds: float,
        rank_rates: Sequence[float] = (),
        remaining_steps: float = 0.0,
        checkpointed: bool = False,
        local_batch: int | None = None,
    ) -> dict[str, Any] | None:
        """Elastic jobs (docs/elastic.md): one statistics window of ``batches`` mini-batches
        (10 in the paper) run at ``workers`` in ``seconds``, each rank's own throughput and
        the steps left; ``checkpointed``: the job saved its state after this window, so the
        portal may regroup it now; ``local_batch``: the samples per rank in each of those
        mini-batches, for a job that follows the answer's ``local_batch`` (the portal then
        compares counts in mini-batches of one size). Returns the portal's answer
        (``workers``: the count the engine wants; ``replace_ranks``: ranks to be replaced by
        spares; ``local_batch``; ``explanation``; ``regroup``: True when the portal has just
        regrouped the job: this attempt's ranks will be stopped and the next attempt resumes
        from the checkpoint with the new ``WORLD_SIZE``, so stop training and wait), None when
        disabled or unreachable. ``workers`` is kept in ``self.workers``."""
        if not self.enabled:
            return None
        body = {
            "workers": workers,
            "batches": batches,
            "seconds": seconds,
            "rank_rates": list(rank_rates),
            "remaining_steps": remaining_steps,
            "elapsed_s": self.clock() - self._t0,
            "checkpointed": bool(checkpointed),
        }
        if local_batch is not None:
            body["local_batch"] = int(local_batch)
        data = self._post_json(ELASTIC_PATH, body)
        if data is not None and data.get("workers"):
            self.workers = int(data["workers"])
        return data

    def _post(self, body: Mapping[str, Any]) -> Reply | None:
        data = self._post_json(REPORT_PATH, body)
        return None if data is None else Reply.from_json(data)

    def _post_json(self, path: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        request = urllib.request.Request(  # noqa: S310 (http(s) only, checked in __init__)
            self.url + path,
            data=json.dumps(body).encode(),
            method="POST",
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )
        try:
            # S310: the URL is checked to be http(s) in __init__.
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
                data = json.loads(response.read().decode() or "{}")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            self.last_error = f"{exc.code}: {detail}"
            if exc.code in (401, 403):
                self.enabled = False
                log.warning("Cosched refused this job's token (%s); reporting stops", exc.code)
            else:
                log.warning("Cosched refused a report: %s", self.last_error)
            if self.strict:
                raise SdkError(exc.code, detail) from exc
            return None
        except (OSError, ValueError) as exc:
            self.last_error = str(exc)
            log.warning("Cosched unreachable (%s); keeping data ratio %s", exc, self.data_ratio)
            if self.strict:
                raise SdkError(0, str(exc)) from exc
            return None
        if not isinstance(data, dict):
            self.last_error = "the reply is not a JSON object"
            return None
        return data


_default: TrainingClient | None = None


def default_client() -> TrainingClient:
    """The process-wide client configured from the environment."""
    global _default
    if _default is None:
        _default = TrainingClient()
    return _default


def report(iteration: int, epoch_end: bool = False, **kwargs: Any) -> Reply | None:
    """``default_client().report(...)``: see ``TrainingClient.report``."""
    return default_client().report(iteration, epoch_end, **kwargs)
