"""Elastic jobs in the cluster simulator (scheduler/simulator/engine.py + elastic.py):
SET_WORKERS / REPLACE_WORKERS applied, GPU time charged, batch sizes from Gavel's rows, and
the elastic002_cluster scenario."""

from __future__ import annotations

import csv
import math
import random

import pytest

from scheduler.domain import Action, ActionKind, ClusterState, JobKind, JobSpec, Plan, Profile
from scheduler.policies.elastic import ElasticPolicy
from scheduler.policies.fifo import FifoPolicy
from scheduler.policies.registry import build_policy
from scheduler.scenarios.elastic002_cluster import (
    Elastic002Cluster,
    cluster_of,
    draw_jobs,
    job_specs,
    run_elastic002_cluster,
    summarize_elastic002_cluster,
)
from scheduler.simulator import SimConfig, simulate
from scheduler.simulator.elastic import (
    GAVEL_THROUGHPUTS,
    ElasticModel,
    StragglerFaults,
    effective_local_batch,
    load_curve_table,
)
from tests.scheduler.sim_helpers import cluster

TABLE = load_curve_table()
R18 = "ResNet-18 (batch size 64)"


def two_nodes(per_node: int = 4):
    return cluster({"name": "v", "count": 2, "gpu_model": "V100", "gpus_per_node": per_node})


def dp_job(
    job_id: str,
    job_type: str = R18,
    *,
    gpus: int = 2,
    hours: float = 0.5,
    arrival: float = 0.0,
    elastic: tuple[int, int] | None = (1, 8),
    max_global: int | None = None,
) -> JobSpec:
    curve = TABLE.curve(job_type, "V100")
    assert curve is not None
    steps = curve.consolidated[1] * hours * 3600.0
    profile = Profile(
        name=job_type,
        kind=JobKind.DL_TRAIN,
        gpu_time_s={"V100": steps / curve.throughput(gpus, 4)},
        batch_size=TABLE.batch.get(job_type),
    )
    return JobSpec(
        id=job_id,
        arrival_s=arrival,
        gpus=gpus,
        profile=profile,
        job_type=job_type,
        params={"total_steps": steps},
        elastic_min=elastic[0] if elastic else None,
        elastic_max=elastic[1] if elastic else None,
        max_global_batch=max_global,
    )


class Scripted(FifoPolicy):
    """fifo plus scripted actions: ``script`` maps a job id to the actions to return (once
    each) when its RunningJob first carries an engine state; ``seen`` keeps the snapshots."""

    name = "scripted"

    def __init__(self, script: dict[str, list[Action]]) -> None:
        super().__init__()
        self.script = {k: list(v) for k, v in script.items()}
        self.seen: list[ClusterState] = []

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        plan = super().schedule(state, rng)
        self.seen.append(state)
        actions = list(plan.actions)
        for running in state.running:
            todo = self.script.get(running.job.id)
            if todo and running.elastic is not None and not running.elastic.in_transition:
                actions.append(todo.pop(0))
        return Plan(plan.decisions, tuple(actions), plan.waiting)


def set_workers(job_id: str, workers: int) -> Action:
    return Action(ActionKind.SET_WORKERS, job_id, "scripted", f"to {workers}", {"workers": workers})


MODEL = ElasticModel(warmup_s=60.0, regroup_s=5.0, noise_sd=0.0)


def run(jobs, policy, model: ElasticModel = MODEL, per_node: int = 4):
    return simulate(two_nodes(per_node), jobs, policy, config=SimConfig(elastic_model=model))


def test_set_workers_grows_onto_idle_gpus_and_charges_them():
    work = TABLE.curve(R18, "V100").consolidated[1] * 0.5 * 3600.0 * 64  # samples
    static_model = ElasticModel(warmup_s=60.0, regroup_s=5.0, noise_sd=0.0, static_jobs=True)
    static = run([dp_job("a", elastic=None)], build_policy("fifo"), static_model)
    r2 = TABLE.rate(R18, "V100", 2, False, 64)[0]
    # a static run: 60 s warm-up, then the work at the measured 2-GPU rate, on 2 GPUs
    assert static.jobs[0].run_s == pytest.approx(60.0 + work / r2)
    assert static.gpu_seconds["a"] == pytest.approx(2 * static.jobs[0].run_s)

    policy = Scripted({"a": [set_workers("a", 4)]})
    grown = run([dp_job("a")], policy)
    events = [(e.kind, e.workers_from, e.workers_to) for e in grown.elastic_events]
    assert events == [("set_workers", 2, 4), ("applied", 2, 4)]
    decided, applied = grown.elastic_events[0].t_s, grown.elastic_events[1].t_s
    assert applied - decided == pytest.approx(60.0)  # the new workers' warm-up
    # 2 GPUs until the decision, 4 (2 warming) from then on; 4 GPUs on one node
    run_s = grown.jobs[0].run_s
    assert grown.gpu_seconds["a"] == pytest.approx(2 * decided + 4 * (run_s - decided))
    assert grown.jobs[0].location.count(",") == 3 and "+" not in grown.jobs[0].location
    # done = 2-GPU rate until the change (minus the first warm-up) + 4-GPU rate after the
    # 5 s regroup pause
    r4 = TABLE.rate(R18, "V100", 4, False, 64)[0]
    t4 = (work - r2 * (applied - 60.0)) / r4
    assert run_s == pytest.approx(applied + 5.0 + t4)
    assert run_s < static.jobs[0].run_s  # 4 GPUs are faster on this curve
    # the policy saw the new count in the job's engine state and placement
    later = [rj for s in policy.seen for rj in s.running if rj.elastic is not None]
    assert later[-1].elastic.workers == 4 and later[-1].placement.gpu_count == 4


def test_shrink_releases_gpus_at_once_for_the_queue():
    jobs = [dp_job("a", gpus=4), dp_job("b", gpus=2, arrival=100.0, elastic=None)]
    res = run(jobs, Scripted({"a": [set_workers("a", 2)]}), per_node=2)
    kinds = [(e.kind, e.workers_to) for e in res.elastic_events]
    assert kinds == [("set_workers", 2)]
    a, b = res.jobs
    # a went 4 -> 2 before b arrived: b starts at its arrival on the released node
    assert b.start_s == pytest.approx(100.0)
    assert res.elastic_events[0].t_s < 100.0
    shrink_t = res.elastic_events[0].t_s
    assert res.gpu_seconds["a"] == pytest.approx(4 * shrink_t + 2 * (a.run_s - shrink_t))


def test_an_ignored_set_workers_would_fail_this_test():
    """Without the action the job keeps 2 GPUs: the simulator must not drop it."""
    kept = run([dp_job("a")], Scripted({}))
    grown = run([dp_job("a")], Scripted({"a": [set_workers("a", 4)]}))
    assert kept.gpu_seconds["a"] != pytest.approx(grown.gpu_seconds["a"])
    assert grown.jobs[0].run_s < kept.jobs[0].run_s - 60.0
    assert grown.ignored_actions == 0


def test_no_room_skips_the_action_and_logs_it():
    jobs = [dp_job("a"), dp_job("b", elastic=None, gpus=4, hours=2.0)]
    res = run(jobs, Scripted({"a": [set_workers("a", 8)]}), per_node=4)
    skipped = [e for e in res.elastic_events if e.kind.startswith("skipped")]
    assert skipped and "idle" in skipped[0].text
    assert res.ignored_actions == len(skipped)
    assert all(r.end_reason == "completed" for r in res.jobs)


FAULTS = StragglerFaults(persistent_per_hour=2.0, slow_factor=0.5)


def test_replace_workers_swaps_the_straggler_for_a_spare_and_releases_its_gpu():
    model = ElasticModel(noise_sd=0.0, faults=FAULTS, seed=1)
    job = dp_job("a", gpus=2, hours=1.0, elastic=(2, 2))
    res = run([job], build_policy("elastic", {"scale_step_workers": 1}), model, per_node=4)
    asked = [e for e in res.elastic_events if e.kind == "replace_workers"]
    done = [e for e in res.elastic_events if e.kind == "applied"]
    assert asked and len(done) == len(asked)
    assert all(d.t_s - a.t_s == pytest.approx(60.0) for a, d in zip(asked, done, strict=True))
    # the engine flagged a rank under 0.8 of the median (a rank at half speed)
    assert "persistent straggler" in asked[0].text
    # same faults, no replacement (static 2): slower, and GPU time 2 x its run time
    static = run(
        [dp_job("a", gpus=2, hours=1.0, elastic=None)],
        build_policy("fifo"),
        ElasticModel(noise_sd=0.0, faults=FAULTS, seed=1, static_jobs=True),
    )
    assert res.jobs[0].run_s < static.jobs[0].run_s
    # each replacement held a third GPU for the 60 s warm-up only
    extra = res.gpu_seconds["a"] - 2 * res.jobs[0].run_s
    assert extra == pytest.approx(60.0 * len(asked), rel=1e-6)


class Recording(ElasticPolicy):
    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.placements: list[tuple[tuple[str, int], ...]] = []

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        self.placements += [rj.placement.gpu_keys for rj in state.running]
        return super().schedule(state, rng)


def test_the_spare_takes_the_stragglers_rank_and_its_gpu_is_freed():
    model = ElasticModel(noise_sd=0.0, faults=FAULTS, seed=1)
    policy = Recording(scale_step_workers=1)
    config = SimConfig(elastic_model=model, reschedule_interval_s=10.0)  # snapshots every 10 s
    job = dp_job("a", gpus=2, hours=1.0, elastic=(2, 2))
    res = simulate(two_nodes(4), [job], policy, config=config)
    first = res.elastic_events[0]
    assert first.kind == "replace_workers"
    rank = int(first.text.split("[")[1].split("]")[0])
    seen = list(dict.fromkeys(policy.placements))
    before, warming, after = seen[0], seen[1], seen[2]
    assert len(before) == 2 and len(warming) == 3 and len(after) == 2
    spare = warming[2]
    assert spare not in before
    # after the warm-up the spare holds the straggler's rank; the straggler's GPU is free
    assert after[rank] == spare and before[rank] not in after
    assert after[1 - rank] == before[1 - rank]


def test_jobs_without_a_worker_range_keep_their_profile_times():
    job = dp_job("a", gpus=2, elastic=None)
    res = run([job], build_policy("fifo"))  # static_jobs is off by default
    assert res.jobs[0].run_s == pytest.approx(job.profile.gpu_time_s["V100"])


def test_replace_without_a_spare_is_skipped_not_a_crash():

    model = ElasticModel(noise_sd=0.0, faults=FAULTS, seed=1)
    job = dp_job("a", gpus=2, hours=1.0, elastic=(2, 2))
    # the policy itself proposes no replacement without an idle spare
    res = run([job], build_policy("elastic", {"scale_step_workers": 1}), model, per_node=1)
    assert not any("replace" in e.kind for e in res.elastic_events)
    assert res.jobs[0].end_reason == "completed"

    class Blind(ElasticPolicy):  # believes spares exist: the simulator must refuse
        @staticmethod
        def _idle_of_model(running, state, taken):
            return [("nowhere", i) for i in range(8)]

    res = run([job], Blind(scale_step_workers=1), model, per_node=1)
    kinds = {e.kind for e in res.elastic_events}
    assert "skipped replace_workers" in kinds and "applied" not in kinds
    assert "no idle spare" in next(
        e.text for e in res.elastic_events if e.kind == "skipped replace_workers"
    )
    assert res.jobs[0].end_reason == "completed"


def test_batch_rows_come_from_gavels_table():
    fam = [b for b, _ in TABLE.family[R18]]
    assert fam == [16, 32, 64, 128, 256]
    rows = {}
    with open(GAVEL_THROUGHPUTS, newline="") as fh:
        for r in csv.DictReader(fh):
            rows[(r["job_type"], r["gpu_type"], int(r["scale_factor"]))] = float(r["throughput"])
    # local 32 at 4 workers: the "batch size 32" row, in samples
    units, used = TABLE.rate(R18, "V100", 4, False, 32)
    assert used == 32 and units == pytest.approx(
        rows[("ResNet-18 (batch size 32)", "v100", 4)] * 32
    )
    # 48 is not measured: the nearest at or below (32); spread: the unconsolidated row
    assert TABLE.rate(R18, "V100", 4, True, 48) == (
        pytest.approx(rows[("ResNet-18 (batch size 32)", "v100_unconsolidated", 4)] * 32),
        32,
    )
    # below the smallest measured: the smallest
    assert TABLE.rate(R18, "V100", 2, False, 8)[1] == 16
    # no batch size (A3C): steps at its own row
    assert TABLE.rate("A3C", "V100", 1, False, 5)[1] is None
    assert effective_local_batch(4, 64, 128) == 32
    assert effective_local_batch(2, 64, 128) == 64
    assert effective_local_batch(4, 64, None) == 64


def test_a_maximum_global_batch_slows_a_static_job_by_the_measured_rows():
    model = ElasticModel(noise_sd=0.0, static_jobs=True)
    free = run([dp_job("a", gpus=4, elastic=None)], build_policy("fifo"), model)
    capped = run([dp_job("a", gpus=4, elastic=None, max_global=128)], build_policy("fifo"), model)
    work = TABLE.curve(R18, "V100").consolidated[1] * 0.5 * 3600.0 * 64
    r64 = TABLE.rate(R18, "V100", 4, False, 64)[0]
    r32 = TABLE.rate(R18, "V100", 4, False, 32)[0]
    assert free.jobs[0].run_s == pytest.approx(60.0 + work / r64)
    # 4 x 64 > 128: local batch 32, the same samples at the 32-row's samples per second
    assert capped.jobs[0].run_s == pytest.approx(60.0 + work / r32)
    assert not math.isclose(r32, r64)


def test_the_cluster_scenario_compares_elastic_with_static_allocations():
    sc = Elastic002Cluster(jobs=6, layouts=(("2x4", 2),), loads=(("heavy", 12.0),))
    runs = run_elastic002_cluster(sc, seeds=1, variants=("clean", "faults"))
    table = summarize_elastic002_cluster(runs)
    modes = set(table["mode"])
    assert {"static1", "static2", "static4", "elastic", "elastic_value", "replace4"} <= modes
    assert "elastic_noyield" in modes  # the same policy with yield_to_queue off
    assert all(c == "6 of 6" for c in table["completed"])
    elastic = runs[(runs["mode"] == "elastic") & (runs["variant"] == "clean")].iloc[0]
    assert elastic.scale_changes > 0 and elastic.gpu_h > 0


class Checked(ElasticPolicy):
    """The elastic policy, checking every snapshot: one job per GPU, a running job listed on
    exactly its placement's GPUs, the engine's count within them."""

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        held: dict[str, int] = {}
        for node in state.nodes:
            for gpu in node.gpus:
                assert len(gpu.job_ids) <= 1
                for j in gpu.job_ids:
                    held[j] = held.get(j, 0) + 1
        for rj in state.running:
            assert held.get(rj.job.id, 0) == rj.placement.gpu_count
            if rj.elastic is not None:
                assert rj.elastic.workers <= rj.placement.gpu_count
        return super().schedule(state, rng)


def test_many_elastic_jobs_with_stragglers_keep_the_books_straight():
    sc = Elastic002Cluster(jobs=10)
    faults = StragglerFaults(persistent_per_hour=2.0, transient_per_hour=8.0)
    for seed, factor in ((0, None), (1, 4)):
        jobs = job_specs(sc, draw_jobs(sc, seed, 12.0), 2, elastic=(1, 8), batch_factor=factor)
        res = simulate(
            cluster_of(2),
            jobs,
            Checked(scale_step_workers=1 + seed),
            config=SimConfig(seed=seed, elastic_model=ElasticModel(faults=faults, seed=seed)),
        )
        assert all(r.end_reason == "completed" for r in res.jobs)
        assert any(e.kind == "applied" for e in res.elastic_events)
        # every GPU-second held is a busy GPU-second of the timeline, and the other way round
        tl = res.timeline
        busy = sum(a.busy_gpus * (b.t_s - a.t_s) for a, b in zip(tl, tl[1:], strict=False))
        assert sum(res.gpu_seconds.values()) == pytest.approx(busy)


def test_a_scenario_file_sets_the_elastic_model(tmp_path):
    from scheduler.inputs import InputError
    from scheduler.scenarios import load_scenario

    (tmp_path / "t.csv").write_text(
        f"job_id,job_type,arrival_time_s,total_steps,scale_factor\n0,{R18},0,20000,2\n"
    )
    text = """
cluster: {nodes: [{name: v, count: 1, gpu_model: V100, gpus_per_node: 4}]}
trace: {file: t.csv, format: gavel}
policies: [fifo]
simulation:
  elastic_model: {warmup_s: 30, static_jobs: true, faults: {persistent_per_hour: 0.5}}
"""
    (tmp_path / "s.yaml").write_text(text)
    sc = load_scenario(str(tmp_path / "s.yaml"))
    model = sc.config.elastic_model
    assert model is not None and model.warmup_s == 30 and model.static_jobs
    assert model.faults.persistent_per_hour == 0.5
    res = simulate(sc.cluster, sc.jobs, build_policy("fifo"), config=sc.config)
    # curve-modelled: 30 s warm-up + the steps at the measured 2-GPU rate
    rate = TABLE.curve(R18, "V100").consolidated[2]
    assert res.jobs[0].run_s == pytest.approx(30.0 + 20000 / rate)
    (tmp_path / "s.yaml").write_text(text.replace("warmup_s", "warmup"))
    with pytest.raises(InputError, match="elastic_model.warmup"):
        load_scenario(str(tmp_path / "s.yaml"))


def test_an_incomplete_seed_shows_n_of_m_and_no_average():
    import pandas as pd

    base = {"load": "l", "layout": "2x4", "variant": "clean", "jobs": 4, "gpu_h": 1.0}
    zeros = {"scale_changes": 0, "replacements": 0, "skipped": 0}
    rows = [
        {**base, **zeros, "mode": "static1", "seed": 0, "completed": 4, "avg_jct_h": 2.0,
         "makespan_h": 3.0, "avg_queue_h": 0.0},
        {**base, **zeros, "mode": "elastic", "seed": 0, "completed": 4, "avg_jct_h": 1.0,
         "makespan_h": 2.0, "avg_queue_h": 0.0},
        {**base, **zeros, "mode": "elastic", "seed": 1, "completed": 3, "avg_jct_h": math.nan,
         "makespan_h": math.nan, "avg_queue_h": math.nan},
    ]  # fmt: skip
    table = summarize_elastic002_cluster(pd.DataFrame(rows)).set_index("mode")
    assert table.loc["elastic", "completed"] == "7 of 8"
    assert math.isnan(table.loc["elastic", "avg_jct_h"])
    assert table.loc["static1", "completed"] == "4 of 4"
