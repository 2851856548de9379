"""Estimates with uncertainty, learned online from ``Observation``s.

Every estimate is a log-normal belief: a central ``value`` and ``sigma``, the standard deviation
of its logarithm. Sources are combined by precision (1 / sigma^2) in log space:

- **priors**: the job's profile (solo time per GPU model; ``prior_sigma``, default 0.5, since
  declared work is rough) and, for co-runs, ``pair_prior`` (a callable: e.g. a pair table with
  its own noise, or the Co-scheML predictor; ``pair_prior_sigma``, default 0.3);
- **the job itself**: its progress windows alone on a model give its solo rate there
  (``obs_sigma`` per window-minute aggregate, shrinking with the number of windows);
- **its type**: other jobs of the same ``type_key`` on the same model (their observed solo times,
  completed durations), with the spread between those jobs as sigma;
- **co-runs**: windows beside the same co-runner types, under the same mode and model, divided by
  the same job's observed solo rate, give the normalised co-run speed.

The object is mutable (``observe`` adds evidence) and read-only for policies by convention:
policies call ``solo_time``, ``remaining_s`` and ``co_run_speed`` and never ``observe``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence

from scheduler.domain import JobSpec, SharingMode
from scheduler.estimate import Estimate
from scheduler.knowledge.observations import Observation, ObservationKind

#: A prior for the normalised co-run speed of ``job`` on ``gpu_model`` beside ``co_runners``
#: under ``mode`` (1.0: as fast as alone), or None where the source does not know.
PairPrior = Callable[[JobSpec, Sequence[JobSpec], str, SharingMode], float | None]

_MIN_SIGMA = 0.02
#: Completed run times a length distribution keeps (the latest of its pool).
DURATION_SAMPLES = 500


def _combine(parts: Sequence[tuple[float, float, int, str]]) -> Estimate | None:
    """Precision-weighted mean of (log value, sigma, n, source) parts."""
    if not parts:
        return None
    weights = [1.0 / max(s, _MIN_SIGMA) ** 2 for _, s, _, _ in parts]
    total = sum(weights)
    mean = sum(w * m for w, (m, _, _, _) in zip(weights, parts, strict=True)) / total
    return Estimate(
        value=math.exp(mean),
        sigma=math.sqrt(1.0 / total),
        n=sum(n for _, _, n, _ in parts),
        source="; ".join(src for _, _, _, src in parts if src),
    )


class _Rate:
    """Progress and seconds summed over windows (a rate that weights long windows more)."""

    __slots__ = ("progress", "seconds", "windows")

    def __init__(self) -> None:
        self.progress = 0.0
        self.seconds = 0.0
        self.windows = 0

    def add(self, progress: float, seconds: float, windows: int = 1) -> None:
        self.progress += progress
        self.seconds += seconds
        self.windows += windows

    @property
    def rate(self) -> float | None:
        if self.seconds <= 0 or self.progress <= 0:
            return None
        return self.progress / self.seconds


class Knowledge:
    """Online estimates of solo times and co-run speeds (see the module docstring)."""

    def __init__(
        self,
        *,
        prior_sigma: float = 0.5,
        pair_prior_sigma: float = 0.3,
        obs_sigma: float = 0.15,
        pair_prior: PairPrior | None = None,
    ) -> None:
        for name, v in (
            ("prior_sigma", prior_sigma),
            ("pair_prior_sigma", pair_prior_sigma),
            ("obs_sigma", obs_sigma),
        ):
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be > 0, got {v!r}")
        self.prior_sigma = prior_sigma
        self.pair_prior_sigma = pair_prior_sigma
        self.obs_sigma = obs_sigma
        self.pair_prior = pair_prior
        # (job id, model, spread) -> its solo progress windows
        self._solo: dict[tuple[str, str | None, bool], _Rate] = defaultdict(_Rate)
        # (job id, model, mode, co-runner types) -> its co-run windows
        self._corun: dict[tuple[str, str | None, SharingMode, tuple[str, ...]], _Rate] = (
            defaultdict(_Rate)
        )
        # job id -> (type, owner): to pool a job's windows by type
        self._who: dict[str, tuple[str, str | None]] = {}
        # (type, model, spread) -> ids of jobs of that type with solo windows there. Ids are
        # dict keys (in the order first seen), not a set: estimates sum over them, and a set's
        # order of strings changes with each process's hash seed, so the last bits of a sum
        # (and, through an LP's tie-breaks, a peer's plans) would differ between runs.
        self._by_type: dict[tuple[str, str | None, bool], dict[str, None]] = defaultdict(dict)
        # (model, mode, co-runner types, type) -> ids of jobs with such co-run windows (same)
        self._corun_by_type: dict[
            tuple[str | None, SharingMode, tuple[str, ...], str], dict[str, None]
        ] = defaultdict(dict)
        # (type, owner or None) -> completed run times (s)
        self._durations: dict[tuple[str, str | None], list[float]] = defaultdict(list)
        self._all_durations: list[float] = []  # every completed run time, in order
        # duration_samples answers, cleared by every completion
        self._samples: dict[tuple[str, str | None], tuple[tuple[float, ...], str, bool]] = {}
        self.observations = 0
        # co_run_speed answers, cleared by every observation (policies ask the same pairs of
        # types many times a cycle)
        self._pair_cache: dict[tuple, Estimate | None] = {}
        self._corun_jobs: set[str] = set()

    # -- learning -----------------------------------------------------------------------------

    def observe(self, obs: Observation, *, reports: int = 1) -> None:
        """Add what the cluster saw (a progress window or a completion).

        ``reports``: the progress reports a window stands for (default one). A simulator
        that hands over the reports of a job at one speed and co-location folded into one
        window (their summed progress and seconds) passes how many there were, so the
        window counts as many as the reports would have (the measured solo time's sigma
        shrinks with the count). At least 1."""
        if reports < 1:
            raise ValueError(f"reports must be >= 1, got {reports!r}")
        self.observations += reports
        self._pair_cache.clear()
        self._who[obs.job_id] = (obs.job_type, obs.owner)
        if obs.kind is ObservationKind.COMPLETED:
            if obs.owner is not None:
                self._durations[(obs.job_type, obs.owner)].append(obs.window_s)
            self._durations[(obs.job_type, None)].append(obs.window_s)  # once without owner
            self._all_durations.append(obs.window_s)
            self._samples.clear()
            return
        done = obs.progress_to - obs.progress_from
        if done <= 0:
            return
        if obs.alone and obs.mode is not SharingMode.MIG:
            self._solo[(obs.job_id, obs.gpu_model, obs.spread)].add(done, obs.window_s, reports)
            self._by_type[(obs.job_type, obs.gpu_model, obs.spread)][obs.job_id] = None
        elif not obs.alone:
            co = tuple(sorted(set(obs.co_runners)))
            self._corun[(obs.job_id, obs.gpu_model, obs.mode, co)].add(done, obs.window_s, reports)
            self._corun_by_type[(obs.gpu_model, obs.mode, co, obs.job_type)][obs.job_id] = None
            self._corun_jobs.add(obs.job_id)

    def observe_all(self, observations: Sequence[Observation]) -> None:
        for obs in observations:
            self.observe(obs)

    # -- estimates ----------------------------------------------------------------------------

    def _job_solo_rate(self, job_id: str, model: str | None, spread: bool) -> _Rate | None:
        r = self._solo.get((job_id, model, spread))
        return r if r is not None and r.rate is not None else None

    def _type_solo_times(self, job_type: str, model: str | None, spread: bool) -> list[float]:
        out = []
        for jid in self._by_type.get((job_type, model, spread), ()):
            r = self._solo.get((jid, model, spread))
            if r is not None and r.rate is not None:
                out.append(1.0 / r.rate)
        return out

    def solo_time(
        self, job: JobSpec, gpu_model: str | None, *, spread: bool = False
    ) -> Estimate | None:
        """The job's whole run time alone on ``gpu_model`` (None: CPU), or None if nothing
        (profile, own windows, same-type jobs) says anything."""
        parts: list[tuple[float, float, int, str]] = []
        prior = job.run_time_s(gpu_model, spread=spread)
        if prior is not None and prior > 0:
            parts.append((math.log(prior), self.prior_sigma, 0, "profile"))
        own = self._job_solo_rate(job.id, gpu_model, spread)
        if own is not None and own.rate is not None:
            sigma = self.obs_sigma / math.sqrt(own.windows)
            parts.append(
                (-math.log(own.rate), sigma, own.windows, f"measured: {own.windows} windows")
            )
        else:
            key = job.type_key()
            times = [t for t in self._type_solo_times(key, gpu_model, spread) if t > 0]
            if times:
                logs = [math.log(t) for t in times]
                mean = sum(logs) / len(logs)
                spread_sigma = (
                    math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
                    if len(logs) > 1
                    else self.prior_sigma
                )
                parts.append(
                    (
                        mean,
                        max(spread_sigma, self.obs_sigma),
                        len(times),
                        f"{len(times)} jobs of type {key}",
                    )
                )
        return _combine(parts)

    def remaining_s(
        self, job: JobSpec, gpu_model: str | None, progress: float, *, spread: bool = False
    ) -> Estimate | None:
        """Seconds left alone on ``gpu_model`` at ``progress`` (0..1)."""
        est = self.solo_time(job, gpu_model, spread=spread)
        if est is None:
            return None
        left = max(0.0, 1.0 - progress)
        return Estimate(est.value * left, est.sigma, est.n, est.source)

    def duration(self, job_type: str, owner: str | None = None) -> Estimate | None:
        """Completed jobs' run times of ``job_type`` (by ``owner`` where known): a length
        estimate for jobs without a profile."""
        times = self._durations.get((job_type, owner)) or self._durations.get((job_type, None))
        if not times:
            return None
        logs = [math.log(max(t, 1e-9)) for t in times]
        mean = sum(logs) / len(logs)
        sigma = (
            math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
            if len(logs) > 1
            else self.prior_sigma
        )
        return Estimate(
            math.exp(mean), max(sigma, self.obs_sigma), len(times), f"{len(times)} completed"
        )

    def duration_samples(
        self, job_type: str, owner: str | None = None, *, at_least: int = 5
    ) -> tuple[tuple[float, ...], str, bool]:
        """(completed jobs' run times, ascending; what they are; whether they are the type's)
        for a job of ``job_type`` by ``owner`` whose length is unknown: that owner's jobs of
        the type when at least ``at_least`` completed, else the type's, else every completed
        job's (the empirical length distribution ``scheduler.gittins`` reads; the flag is
        False for the last). The latest ``DURATION_SAMPLES`` of the pool; empty when nothing
        completed yet."""
        key = (job_type, owner)
        hit = self._samples.get(key)
        if hit is not None:
            return hit
        pools: list[tuple[list[float], str]] = []
        if owner is not None:
            pools.append(
                (self._durations.get((job_type, owner), []), f"of type {job_type} by {owner}")
            )
        pools.append((self._durations.get((job_type, None), []), f"of type {job_type}"))
        chosen: list[float] = self._all_durations
        what, typed = "of any type", False
        for times, label in pools:
            if len(times) >= at_least:
                chosen, what, typed = times, label, True
                break
        recent = sorted(chosen[-DURATION_SAMPLES:])
        out = (tuple(recent), f"{len(recent)} completed jobs {what}" if recent else "", typed)
        self._samples[key] = out
        return out

    def co_run_possible(
        self,
        job: JobSpec,
        gpu_model: str,
        co_runners: Sequence[JobSpec],
        mode: SharingMode,
    ) -> bool:
        """False where the pair prior holds that the job cannot run beside ``co_runners`` at
        all (a co-run speed of 0: measured infeasible, e.g. out of memory) and the job was
        never seen running beside them; True otherwise (unknown pairs included: the cluster
        finds out, and an OOM it observes keeps the pair apart through ``JobSpec.oom_with``)."""
        if not co_runners or self.pair_prior is None:
            return True
        others = tuple(sorted({c.type_key() for c in co_runners}))
        own = job.type_key()
        if self._corun_by_type.get((gpu_model, mode, others, own)):
            return True
        # A pair seen running either way round ran together.
        if len(others) == 1 and self._corun_by_type.get((gpu_model, mode, (own,), others[0])):
            return True
        p = self.pair_prior(job, co_runners, gpu_model, mode)
        return p is None or p > 0

    def co_run_speed(
        self,
        job: JobSpec,
        gpu_model: str,
        co_runners: Sequence[JobSpec],
        mode: SharingMode,
    ) -> Estimate | None:
        """The job's speed beside ``co_runners`` over its speed alone (1.0: no slowdown), or
        None where neither a prior nor a measurement knows the pair."""
        own = job.id if job.id in self._corun_jobs else None
        ckey = (
            job.type_key(),
            job.gpus,
            own,
            gpu_model,
            mode,
            tuple(sorted((c.type_key(), c.gpus) for c in co_runners)),
        )
        try:
            return self._pair_cache[ckey]
        except KeyError:
            pass
        est = self._co_run_speed(job, gpu_model, co_runners, mode)
        self._pair_cache[ckey] = est
        return est

    def _co_run_speed(
        self,
        job: JobSpec,
        gpu_model: str,
        co_runners: Sequence[JobSpec],
        mode: SharingMode,
    ) -> Estimate | None:
        parts: list[tuple[float, float, int, str]] = []
        if self.pair_prior is not None:
            p = self.pair_prior(job, co_runners, gpu_model, mode)
            if p is not None and p > 0 and math.isfinite(p):
                parts.append((math.log(p), self.pair_prior_sigma, 0, "pair prior"))
        others = tuple(sorted({c.type_key() for c in co_runners}))
        key_type = job.type_key()
        ratios: list[float] = []
        ids = dict(self._corun_by_type.get((gpu_model, mode, others, key_type), {}))
        if (job.id, gpu_model, mode, others) in self._corun:
            ids[job.id] = None
        for jid in ids:
            r = self._corun.get((jid, gpu_model, mode, others))
            if r is None or r.rate is None:
                continue
            solo = self._job_solo_rate(jid, gpu_model, False)
            if solo is not None and solo.rate is not None:
                ratios.append(r.rate / solo.rate)
            elif jid == job.id:
                # Never seen alone: its declared rate alone is 1 / its profile time there
                # (progress counts declared work, so the work estimate's error cancels).
                t = job.run_time_s(gpu_model)
                if t is not None and t > 0:
                    ratios.append(r.rate * t)
        if ratios:
            logs = [math.log(x) for x in ratios if x > 0]
            if logs:
                mean = sum(logs) / len(logs)
                sigma = self.obs_sigma / math.sqrt(len(logs))
                parts.append((mean, sigma, len(logs), f"measured beside {', '.join(others)}"))
        return _combine(parts)
