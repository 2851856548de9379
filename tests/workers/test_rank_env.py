"""One process per GPU (elastic jobs): the launcher environment of each rank (workers.agent)
and the attempt's ``process_per_gpu`` flag in the protocol."""

from __future__ import annotations

from workers.agent import gang_env, rank_envs
from workers.protocol import AttemptSpec, GangPart, SyncReply


def spec(node_rank: int, per_gpu: bool = True, attempt: int = 3) -> AttemptSpec:
    parts = (
        GangPart("a", 0, (0, 1), address="10.0.0.1"),
        GangPart("b", 1, (2,), address="10.0.0.2"),
    )
    return AttemptSpec(
        job_id=42,
        attempt=attempt,
        launch=True,
        paused=False,
        command="train",
        parts=parts,
        node_rank=node_rank,
        process_per_gpu=per_gpu,
    )


def test_each_gpu_is_a_rank_numbered_across_the_nodes():
    a, b = spec(0), spec(1)
    env_a, env_b = gang_env(a), gang_env(b)
    assert env_a["WORLD_SIZE"] == env_b["WORLD_SIZE"] == "3"
    assert env_a["MASTER_ADDR"] == env_b["MASTER_ADDR"] == "10.0.0.1"
    assert env_a["MASTER_PORT"] == env_b["MASTER_PORT"]
    assert (env_a["LOCAL_WORLD_SIZE"], env_b["LOCAL_WORLD_SIZE"]) == ("2", "1")
    assert "RANK" not in env_a  # per process
    ranks_a = rank_envs(a, {"CUDA_VISIBLE_DEVICES": "0,1"}, "a")
    ranks_b = rank_envs(b, {"CUDA_VISIBLE_DEVICES": "2"}, "b")
    assert [(r["RANK"], r["LOCAL_RANK"], r["CUDA_VISIBLE_DEVICES"]) for r in ranks_a] == [
        ("0", "0", "0"),
        ("1", "1", "1"),
    ]
    assert [(r["RANK"], r["COSCHED_GPU"]) for r in ranks_b] == [("2", "b/2")]


def test_one_process_per_node_keeps_the_node_rank_and_a_single_node_gets_nothing():
    env = gang_env(spec(1, per_gpu=False))
    assert (env["WORLD_SIZE"], env["RANK"], env["LOCAL_RANK"]) == ("2", "1", "0")
    assert rank_envs(spec(1, per_gpu=False), {}, "b") is None
    single = AttemptSpec(42, 1, True, False, "x", (GangPart("a", 0, (0,)),))
    assert gang_env(single) == {}


def test_a_regrouped_jobs_next_attempt_gets_another_port():
    ports = {gang_env(spec(0, attempt=n))["MASTER_PORT"] for n in (3, 4)}
    assert len(ports) == 2


def test_the_flag_travels_in_the_sync_reply():
    reply = SyncReply(
        node="b", lease_s=30.0, lease_kill_grace_s=5.0, sync_interval_s=1.0, desired=(spec(1),)
    )
    back = SyncReply.from_json(reply.to_json())
    assert back.desired[0].process_per_gpu is True
    assert back.desired[0].world_size == 3 and back.desired[0].first_rank == 2
