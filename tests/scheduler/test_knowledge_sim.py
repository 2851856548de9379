"""The simulator feeds the knowledge only what a live cluster would observe (issue 24).

Progress windows (rate over declared work, alone or beside co-runner types), completions,
decisions only at round boundaries, a seeded noisy pair prior that measured co-runs correct.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from scheduler.domain import JobSpec, Profile, SharingMode
from scheduler.interference import build_interference
from scheduler.knowledge import Knowledge, Observation, ObservationKind
from scheduler.knowledge.priors import truth_pair_prior
from scheduler.simulator import SimConfig, simulate
from tests.scheduler.sim_helpers import FirstFit, cluster

RESNET = "ResNet-50 (batch size 64)"
TRANSFORMER = "Transformer (batch size 64)"


def one_v100():
    return cluster({"name": "v100", "count": 1, "gpu_model": "V100", "gpus_per_node": 1})


def gjob(job_id: str, solo: float, *, arrival: float = 0.0, job_type: str | None = None) -> JobSpec:
    return JobSpec(
        id=job_id,
        arrival_s=arrival,
        gpus=1,
        job_type=job_type,
        profile=Profile(name=job_id, gpu_time_s={"V100": solo}, gpu_memory_max_mb=1000.0),
    )


def test_progress_windows_measure_the_declared_rate_and_completions_the_true_length() -> None:
    # Declared 500 s, true 1,000 s (engine-private): progress counts declared work, so windows
    # see 1 / 500 per second; the completion tells the true run time.
    k = Knowledge()
    job = gjob("a", 500.0, job_type=RESNET)
    res = simulate(
        one_v100(),
        [job],
        FirstFit(),
        config=SimConfig(observe_every_s=100.0),
        true_work={"a": 2.0},
        knowledge=k,
    )
    assert res.jobs[0].finish_s == pytest.approx(1000.0)
    est = k.solo_time(job, "V100")
    assert est is not None and "measured" in est.source
    assert est.value == pytest.approx(500.0, rel=0.05)
    done = k.duration(RESNET)
    assert done is not None and done.value == pytest.approx(1000.0)


class Recording(Knowledge):
    """A knowledge that keeps every (observation, reports) it was handed."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Observation, int]] = []

    def observe(self, obs: Observation, *, reports: int = 1) -> None:
        self.calls.append((obs, reports))
        super().observe(obs, reports=reports)


@pytest.mark.parametrize(
    ("solo", "true", "ends", "counts"),
    [
        # Alone for 1,000 s: reports at 100, 200, ..., 900 and at its end (ten), handed over
        # at the first sweep, when the window's age doubled (200, 400, 800) and at its end.
        (1000.0, 1.0, [100.0, 200.0, 400.0, 800.0, 1000.0], [1, 1, 2, 4, 2]),
        # Declared 500 s, true 1,000 s: its declared progress stops at 500 s, and so do its
        # reports (five: at 100, ..., 400 and the one that reached 1).
        (500.0, 2.0, [100.0, 200.0, 400.0, 500.0], [1, 1, 2, 1]),
    ],
)
def test_a_jobs_progress_reports_reach_the_knowledge_folded_with_their_count(
    solo: float, true: float, ends: list[float], counts: list[int]
) -> None:
    k = Recording()
    simulate(
        one_v100(),
        [gjob("a", solo, job_type=RESNET)],
        FirstFit(),
        config=SimConfig(observe_every_s=100.0, reschedule_interval_s=10.0),
        true_work={"a": true},
        knowledge=k,
    )
    windows = [(o, n) for o, n in k.calls if o.kind is ObservationKind.PROGRESS]
    assert [o.at_s for o, _ in windows] == pytest.approx(ends)
    assert [n for _, n in windows] == counts
    assert all(o.rate == pytest.approx(1.0 / solo) for o, _ in windows)
    # What ten (five) separate reports would have added up to.
    est = k.solo_time(gjob("a", solo), "V100")
    assert est is not None and est.n == sum(counts)
    assert est.value == pytest.approx(solo, rel=0.01)
    assert k.observations == sum(counts) + 1  # and the completion


def test_a_pair_that_ran_corrects_a_wrong_pair_prior() -> None:
    measured = build_interference("measured")
    c = one_v100()
    a, b = gjob("a", 4000.0, job_type=RESNET), gjob("b", 4000.0, job_type=TRANSFORMER)
    # A prior far off the truth (noise sigma 2), seeded: the same seed, the same prior.
    prior = truth_pair_prior(measured, c, noise=2.0, seed=1)
    again = truth_pair_prior(measured, c, noise=2.0, seed=1)
    exact = truth_pair_prior(measured, c)
    p = prior(a, (b,), "V100", SharingMode.MPS)
    truth = exact(a, (b,), "V100", SharingMode.MPS)
    assert p == again(a, (b,), "V100", SharingMode.MPS)
    assert p is not None and truth is not None and abs(math.log(p / truth)) > 0.1
    k = Knowledge(pair_prior=prior, pair_prior_sigma=2.0)
    before = k.co_run_speed(a, "V100", (b,), SharingMode.MPS)
    assert before is not None and before.value == pytest.approx(p)
    simulate(
        c,
        [a, b],
        FirstFit(mode=SharingMode.MPS, per_gpu=2),
        interference=measured,
        config=SimConfig(observe_every_s=300.0),
        knowledge=k,
    )
    after = k.co_run_speed(a, "V100", (b,), SharingMode.MPS)
    assert after is not None and after.n > 0
    assert after.value == pytest.approx(truth, rel=0.02)
    assert after.sigma < before.sigma


def test_multi_gpu_pairs_have_no_prior_from_the_gavel_table() -> None:
    c = cluster({"name": "v", "count": 1, "gpu_model": "V100", "gpus_per_node": 4})
    prior = truth_pair_prior(build_interference("measured"), c)
    a, b = gjob("a", 1.0, job_type=RESNET), gjob("b", 1.0, job_type=TRANSFORMER)
    assert prior(a, (b,), "V100", SharingMode.MPS) is not None
    a4 = JobSpec(id="a4", arrival_s=0, gpus=4, job_type=RESNET, profile=a.profile)
    b4 = JobSpec(id="b4", arrival_s=0, gpus=4, job_type=TRANSFORMER, profile=b.profile)
    assert prior(a4, (b4,), "V100", SharingMode.MPS) is None


def test_rounds_make_arrivals_wait_for_the_next_round() -> None:
    jobs = [gjob("a", 100.0), gjob("b", 100.0, arrival=10.0)]
    eager = FirstFit()
    res = simulate(cluster({"name": "v", "count": 2, "gpu_model": "V100"}), jobs, eager)
    assert {r.job_id: r.start_s for r in res.jobs} == {"a": 0.0, "b": 10.0}
    rounds = FirstFit()
    res = simulate(
        cluster({"name": "v", "count": 2, "gpu_model": "V100"}),
        jobs,
        rounds,
        config=SimConfig(round_s=360.0),
    )
    assert {r.job_id: r.start_s for r in res.jobs} == {"a": 0.0, "b": 360.0}
    assert all(t % 360.0 == 0 for t in rounds.calls)


def test_the_policy_sees_the_knowledge_the_engine_feeds() -> None:
    seen: list[int] = []

    class Watch(FirstFit):
        def schedule(self, state, rng):  # type: ignore[no-untyped-def]
            assert state.knowledge is not None
            seen.append(state.knowledge.observations)
            return super().schedule(state, rng)

    jobs = [gjob("a", 1000.0, job_type=RESNET), gjob("b", 10.0, arrival=900.0)]
    simulate(one_v100(), jobs, Watch(), config=SimConfig(observe_every_s=60.0))
    assert seen[0] == 0 and seen[-1] > 0
    # learn=False: no knowledge at all.
    plain: list[object] = []

    class Plain(FirstFit):
        def schedule(self, state, rng):  # type: ignore[no-untyped-def]
            plain.append(state.knowledge)
            return super().schedule(state, rng)

    simulate(one_v100(), jobs, Plain(), config=SimConfig(learn=False))
    assert plain and all(k is None for k in plain)


@pytest.mark.parametrize(
    ("flag", "value", "field"),
    [
        ("--pair-noise", "-1", "pair_noise"),
        ("--round-s", "0", "round_s"),
        ("--estimate-noise", "11", "estimate_noise"),
        ("--hide-lengths", "1.5", "hide_lengths"),
    ],
)
def test_bad_noise_and_round_flags_exit_2_naming_the_flag(flag: str, value: str, field: str):
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler.simulate", "--scenario", "seed004", flag, value],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert flag in proc.stderr and field in proc.stderr


@pytest.mark.parametrize(
    ("scenario", "policy", "noise", "every"),
    [("gavel100_p900", "hetero_srtf", 0.5, 300.0), ("coscheml003", "coscheml", 0.0, 20.0)],
)
def test_folded_reports_add_up_to_the_one_at_a_time_reports(
    scenario: str, policy: str, noise: float, every: float
) -> None:
    # Beside the engine's folded hand-over, a twin knowledge gets every job's report one at a
    # time (each report round: every running window; each close: the rest): the same windows,
    # progress and seconds per job and context at the end. With estimate noise, declared
    # progress that reaches 1 early cuts windows; restarts delay them (ready_at).
    import dataclasses

    from scheduler.policies.registry import build_policy
    from scheduler.scenarios import load_scenario
    from scheduler.simulator.engine import Simulator

    class Twin(Simulator):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, **kwargs)
            self.twin = Knowledge()
            self.open: dict = {}  # job -> [start, declared progress, context]

        def _report(self, job, reopen: bool) -> None:  # type: ignore[no-untyped-def]
            t0, p0, ctx = self.open[job]
            if ctx is not None and self.now > t0 and job.ready_at <= t0:
                p = self._declared(job)
                window = self.now - t0
                if p >= 1.0 and job.rate > 0:
                    window = min(window, (1.0 - p0) / (job.rate * job.work_factor))
                if p > p0 + 1e-12 and window > 0:
                    model, mode, co, spread, gpus = ctx
                    self.twin.observe(
                        Observation(
                            kind=ObservationKind.PROGRESS,
                            job_id=job.spec.id,
                            job_type=job.spec.type_key(),
                            at_s=t0 + window,
                            window_s=window,
                            gpu_model=model,
                            gpus=gpus,
                            mode=mode,
                            co_runners=co,
                            progress_from=p0,
                            progress_to=p,
                            spread=spread,
                        )
                    )
            if reopen:
                self.open[job][:2] = [self.now, self._declared(job)]
            else:
                del self.open[job]

        def _observe_window(self, job, *, reopen: bool) -> None:  # type: ignore[no-untyped-def]
            if not reopen and job in self.open:
                self._report(job, False)
            super()._observe_window(job, reopen=reopen)

        def _open_window(self, job, ctx, rate) -> None:  # type: ignore[no-untyped-def]
            super()._open_window(job, ctx, rate)
            self.open[job] = [self.now, self._declared(job), ctx]

        def _sweep_observations(self) -> None:
            if self.now - self.last_sweep >= self.config.observe_every_s:
                for job in self.running.values():
                    if job in self.open and self.open[job][2] is not None:
                        self._report(job, True)
            super()._sweep_observations()

    sc = load_scenario(scenario)
    model = None if sc.interference in (None, "none") else build_interference(sc.interference)
    config = dataclasses.replace(sc.config, estimate_noise=noise, observe_every_s=every)
    folded = Recording()
    sim = Twin(
        sc.cluster,
        list(sc.jobs),
        build_policy(policy),
        interference=model,
        config=config,
        knowledge=folded,
    )
    sim.run()
    twin = sim.twin
    completions = sum(1 for o, _ in folded.calls if o.kind is ObservationKind.COMPLETED)
    assert folded.observations == twin.observations + completions  # every report counted
    assert len(folded.calls) - completions < twin.observations  # in fewer calls
    assert folded._corun or scenario != "coscheml003"  # co-runs measured there
    for table in ("_solo", "_corun"):
        a, b = getattr(folded, table), getattr(twin, table)
        assert set(a) == set(b)
        for key, rate in a.items():
            assert rate.windows == b[key].windows, key
            assert rate.progress == pytest.approx(b[key].progress, rel=1e-9), key
            assert rate.seconds == pytest.approx(b[key].seconds, rel=1e-9), key
    assert sum(r.windows for r in folded._solo.values()) > 2 * len(folded._solo)
