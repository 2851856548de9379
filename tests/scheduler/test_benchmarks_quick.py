"""The two pure-core benchmarks run in quick mode and return sane figures (a few seconds)."""

from __future__ import annotations

import math

from benchmarks import decision_latency, simulator_throughput
from scheduler.policies.registry import available_policies


def _positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_decision_latency_quick(capsys):
    result = decision_latency.run(quick=True)
    rows = result["cluster_sweep"] + result["queue_sweep"]
    assert {r["policy"] for r in rows} == set(available_policies())
    assert not [r for r in rows if "error" in r]
    for r in rows:
        assert _positive(r["cycle_ms"]) and _positive(r["warm_cycle_ms"])
        assert r["per_job_ms"] == r["cycle_ms"] / r["pending"]
        assert 0 <= r["placed"] <= r["pending"]
        # Nodes of up to 8 GPUs.
        assert r["nodes"] == -(-r["gpus"] // 8)
    assert result["goal_met"] is False and result["goal_per_job_ms"] == {}  # not measured
    gang = result["gang_case"]
    assert {r["policy"] for r in gang} == set(available_policies())
    for r in gang:
        assert "error" not in r, r
        assert r["gangs"] == 20 and 0 <= r["gangs_placed"] <= r["gangs"]
    # Gangs of 16 to 32 GPUs on 100 nodes of 8 find room in the quick state: some are placed.
    assert max(r["gangs_placed"] for r in gang) > 0
    out = capsys.readouterr().out
    assert "Decision latency as the cluster grows" in out and "ms/job" in out


def test_state_generator_is_deterministic_and_sized():
    a = decision_latency.build_state(100, 50)
    assert a == decision_latency.build_state(100, 50)
    g = decision_latency.build_state(100, 30, gangs=True)
    assert [j.gpus for j in g.pending][2::3] == [8, 16, 24, 32, 8, 16, 24, 32, 8, 16]
    assert sum(len(n.gpus) for n in a.nodes) == 100 and len(a.pending) == 50
    busy = sum(1 for n in a.nodes for g in n.gpus if g.job_ids)
    assert 0 < busy < 100 and len(a.running) == busy


def test_simulator_throughput_quick(capsys):
    result = simulator_throughput.run(quick=True)
    replays = result["replays"]
    assert [r["policy"] for r in replays] == ["fifo", "binpack"]
    for r in replays:
        assert "error" not in r, r
        assert r["jobs"] == result["trace"]["jobs"] == 300
        assert r["completed"] == r["jobs"] and r["oom_count"] == 0
        assert r["events"] >= 2 * r["jobs"]  # an arrival and an end each, at least
        assert _positive(r["wall_s"]) and _positive(r["events_per_s"])
        assert r["jobs_per_s"] == r["jobs"] / r["wall_s"]
        assert r["peak_rss_mb"] >= r["base_rss_mb"] > 1
    assert "jobs/s" in capsys.readouterr().out


def test_trace_generator_is_deterministic(tmp_path):
    from scheduler.traces import read_trace

    f1 = simulator_throughput.make_trace(tmp_path / "a.csv", 200, 48, seed=1)
    f2 = simulator_throughput.make_trace(tmp_path / "b.csv", 200, 48, seed=1)
    assert f1 == f2 and (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()
    jobs = read_trace(tmp_path / "a.csv", fmt="gavel")
    assert len(jobs) == 200 and {j.gpus for j in jobs} <= {1, 2, 4, 8}
    assert all(set(j.profile.gpu_time_s) <= {"K80", "P100", "V100"} for j in jobs)


def test_a_replay_past_its_wall_limit_stops_and_says_how_far_it_got(tmp_path):
    trace = tmp_path / "t.csv"
    simulator_throughput.make_trace(trace, 300, 48)
    whole = simulator_throughput.replay(str(trace), 48, "fifo", False)
    assert whole["finished"] and whole["completed"] == 300
    stopped = simulator_throughput.replay(str(trace), 48, "fifo", False, limit_s=0.0)
    assert stopped["finished"] is False and stopped["limit_s"] == 0.0
    assert stopped["jobs_done"] == 1 and stopped["sim_s"] > 0 and stopped["policy_calls"] >= 1
    assert stopped["wall_s"] >= 0.0 and stopped["running"] >= 0
