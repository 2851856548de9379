"""``python -m scheduler.reproduce peers``: the same-engine comparison harness."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from scheduler import peers
from scheduler.reproduce import main as reproduce_main
from scheduler.simulator.results import SimConfig


def _run(trace, policy, kind, seed, jct, completed=10):
    return {
        "trace": trace, "policy": policy, "kind": kind, "seed": seed, "jobs": 10,
        "completed": completed, "status": "complete", "avg_jct_s": jct, "p99_jct_s": 2 * jct,
        "makespan_s": 10 * jct, "max_ftf": 1.5, "wall_s": 0.1,
    }  # fmt: skip


def test_summary_gives_medians_ranges_and_ratios_to_the_best_complete_peer():
    runs = pd.DataFrame(
        [
            _run("t", "ours", "ours", 0, 80.0),
            _run("t", "ours", "ours", 1, 100.0),
            _run("t", "ours", "ours", 2, 90.0),
            _run("t", "p1", "peer", 0, 100.0),
            _run("t", "p1", "peer", 1, 100.0),
            _run("t", "p1", "peer", 2, 100.0),
            # p2 looks better but left jobs unfinished in one seed: not the reference
            _run("t", "p2", "peer", 0, 50.0),
            _run("t", "p2", "peer", 1, 50.0, completed=7),
            _run("t", "p2", "peer", 2, 50.0),
        ]
    )
    s = peers.summarize_peers(runs).set_index("policy")
    assert s.loc["ours", "avg_jct_s_median"] == 90.0
    assert (s.loc["ours", "avg_jct_s_min"], s.loc["ours", "avg_jct_s_max"]) == (80.0, 100.0)
    assert s.loc["ours", "best_peer"] == "p1"
    assert s.loc["ours", "avg_jct_s_vs_best_peer"] == pytest.approx(0.9)
    assert s.loc["p2", "incomplete_seeds"] == 1 and s.loc["p2", "completed_min"] == 7
    text = peers.format_peers(s.reset_index())
    assert "7/10 (1 seeds INCOMPLETE)" in text and "0.90" in text


def test_engine_options_are_set_only_where_the_engine_has_them():
    config, missing = peers.engine_options(SimConfig(), 360.0, 0.3)
    names = {f.name for f in dataclasses.fields(SimConfig)}
    for name, value in (("round_s", 360.0), ("pair_noise", 0.3)):
        if name in names:
            assert getattr(config, name) == value and name not in missing
        else:
            assert name in missing

    @dataclasses.dataclass(frozen=True)
    class WithRounds:
        seed: int = 0
        round_s: float | None = None

    config, missing = peers.engine_options(WithRounds(), 360.0, 0.3)
    assert config.round_s == 360.0 and missing == ["pair_noise"]


def test_generated_traces_are_drawn_again_per_seed():
    from scheduler.scenarios import load_scenario

    trace = peers.TRACES["burst"]
    base = load_scenario(trace.scenario).jobs
    assert peers.trace_jobs(trace, base, 0) == list(base)
    other = peers.trace_jobs(trace, base, 1)
    assert len(other) == 100 and [j.profile.gpu_time_s for j in other] != [
        j.profile.gpu_time_s for j in base
    ]
    assert peers.trace_jobs(peers.TRACES["physical96"], base, 3) == list(base)


def test_peers_give_their_round_and_everybody_the_restart_cost():
    assert peers.policy_params("gavel_ftf", 120.0, 60.0) == {"round_s": 120.0}
    assert peers.policy_params("hetero_srtf", 120.0, 60.0)["preemption_cost_s"] == 60.0
    assert "round_s" not in peers.policy_params("allox", 120.0, 60.0)


def test_command_line_runs_and_writes_csv(tmp_path, capsys):
    out = tmp_path / "cmp.csv"
    rc = reproduce_main(
        ["peers", "--traces", "burst", "--seeds", "1", "--policies", "fifo", "tiresias",
         "--quiet", "--out", str(out)]
    )  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    assert "== burst (best peer by median avg JCT: tiresias" in printed
    summary = pd.read_csv(out)
    assert set(summary["policy"]) == {"fifo", "tiresias"}
    assert summary["completed_min"].tolist() == [100, 100]
    runs = pd.read_csv(tmp_path / "cmp_runs.csv")
    assert len(runs) == 2 and (runs["max_ftf"] > 0).all()
    # the largest ratio the 360-s rounds alone force: never above the run's largest ratio
    assert "ftf_floor" in printed
    assert ((runs["max_ftf_floor"] > 0) & (runs["max_ftf_floor"] <= runs["max_ftf"])).all()
    assert (summary.set_index("policy").loc["tiresias", "avg_jct_s_vs_best_peer"]) == 1.0
    # the lower bound no schedule beats (scheduler.jct_bound) stands above the table
    assert "no policy can beat: avg JCT >= " in printed
    assert (summary["avg_jct_bound_s_median"] <= summary["avg_jct_s_median"]).all()
    assert (runs["avg_jct_bound_s"] > 0).all()


def test_command_line_refuses_unknown_policies_and_seeds():
    with pytest.raises(SystemExit):
        peers.main(["--policies", "nope", "--quiet"])
    with pytest.raises(SystemExit):
        peers.main(["--seeds", "0", "--quiet"])


def test_set_changes_one_policys_parameter_and_hidden_lengths_reach_the_engine(capsys):
    # Every length hidden on the contended trace: hetero_srtf's Gittins ranking against its
    # own FIFO fallback, chosen with --set (the header says so); the two differ.
    args = ["--traces", "contended", "--seeds", "1", "--policies", "hetero_srtf", "--quiet",
            "--hide-lengths", "1"]  # fmt: skip
    assert peers.main(args) == 0
    gittins = capsys.readouterr().out
    assert peers.main([*args, "--set", "hetero_srtf.unknown_lengths=fifo"]) == 0
    fifo = capsys.readouterr().out
    assert "100% of the jobs declare no length" in gittins
    assert "hetero_srtf with unknown_lengths='fifo'" in fifo
    row = [line for line in gittins.splitlines() if line.strip().startswith("hetero_srtf")]
    row_fifo = [line for line in fifo.splitlines() if line.strip().startswith("hetero_srtf")]
    assert row and row_fifo and row != row_fifo
    for bad in (["--set", "hetero_srtf.unknown_lengths=bogus"], ["--set", "tiresias.queues=2"],
                ["--set", "hetero_srtf"]):  # fmt: skip
        with pytest.raises(SystemExit):
            peers.main([*args, *bad])


def test_a_run_without_a_peer_prints_its_table_without_ratios():
    runs = pd.DataFrame([_run("t", "ours", "ours", 0, 80.0), _run("t", "fifo", "ours", 0, 90.0)])
    text = peers.format_peers(peers.summarize_peers(runs))
    assert "best peer by median avg JCT: none (no peer in the run)" in text
    rows = [line.split() for line in text.splitlines()[2:] if line.strip()]
    assert [r[0] for r in rows] == ["ours", "fifo"]
    assert all(r[-3:] == ["-", "-", "-"] for r in rows), text
