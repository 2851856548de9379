"""The portal <-> node agent protocol (workers.protocol): round trips and validation."""

from __future__ import annotations

import json

import pytest

from workers.protocol import (
    MAX_ITEMS,
    PROTOCOL_VERSION,
    AttemptKey,
    AttemptResult,
    AttemptSpec,
    GangPart,
    LogTail,
    NodeInfo,
    ProtocolError,
    RunningAttempt,
    Sample,
    SyncReply,
    SyncRequest,
    nudge_channel,
)


def _spec(**kw) -> AttemptSpec:
    base = dict(
        job_id=12,
        attempt=2,
        launch=True,
        paused=False,
        command="python train.py",
        parts=(
            GangPart("a", 0, (0, 1), 4, "10.0.0.1"),
            GangPart("b", 1, (2, 3), 4, "10.0.0.2"),
        ),
        node_rank=1,
        mode="mps",
        mps_percentage=40,
        gpu_model="V100",
        env={"EXTRA": "1"},
        profile={"name": "resnet", "gpu_time_s": {"V100": 10.0}},
        job_name="train",
        job_kind="dl-train",
        gpu_memory_mb=2048.0,
    )
    return AttemptSpec(**(base | kw))


def test_a_request_survives_its_json_form():
    request = SyncRequest(
        node="gpu-1",
        instance="abc",
        seq=17,
        sent_at=1.5,
        running=(RunningAttempt(12, 2, "running", 100.0, 4242),),
        results=(AttemptResult(11, 1, "exited", 200.0, 0, "exit code 0", 150.0, "bye\n"),),
        samples=(Sample("util_pct", 50.0, 3.0, 0), Sample("progress", 0.5, 3.0, None, 12, 2)),
        log_tails=(LogTail(12, 2, "hello"),),
        info=NodeInfo("gpu", 16, 65536, "virtual", ({"index": 0, "model": "A30", "memory_mb": 1},)),
    )
    again = SyncRequest.from_json(request.to_json())
    assert again == request
    assert again.results[0].succeeded and again.running[0].key == AttemptKey(12, 2)


def test_node_info_carries_the_nodes_isolation_and_refuses_an_unknown_level():
    aspect = {"what": "gpu_devices", "level": "ok", "text": "GPU devices: constrained"}
    info = NodeInfo("gpu", 16, 65536, "nvml", isolation=(aspect,))
    request = SyncRequest(node="gpu-1", instance="abc", seq=1, sent_at=1.0, info=info)
    assert SyncRequest.from_json(request.to_json()).info == info
    data = json.loads(request.to_json())
    data["info"]["isolation"][0]["level"] = "great"
    with pytest.raises(ProtocolError, match=r"info\.isolation\[0\]\.level: 'great' is not one"):
        SyncRequest.from_json(json.dumps(data))
    del data["info"]["isolation"]  # an agent that does not say
    assert SyncRequest.from_json(json.dumps(data)).info.isolation == ()


def test_a_reply_survives_its_json_form():
    reply = SyncReply(
        node="gpu-1",
        lease_s=20.0,
        lease_kill_grace_s=5.0,
        sync_interval_s=1.0,
        acked=(AttemptKey(11, 1),),
        desired=(_spec(),),
    )
    again = SyncReply.from_json(reply.to_json())
    assert again == reply and again.applied
    spec = again.desired[0]
    assert spec.part == GangPart("b", 1, (2, 3), 4, "10.0.0.2") and spec.is_gang
    assert str(spec.key) == "12.2"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("node"), "node: required"),
        (lambda d: d.update(seq="7"), "seq: expected an integer, got a string"),
        (lambda d: d.update(seq=0), "seq: must be at least 1, got 0"),
        (lambda d: d.update(version=PROTOCOL_VERSION + 1), "version: this portal speaks"),
        (lambda d: d.update(sent_at=float("nan")), "sent_at: must be a finite number"),
        (lambda d: d.update(sent_at=10**400), "sent_at: out of range for a number"),
        (lambda d: d.update(running=[{"job_id": 1}]), "running[0].attempt: required"),
        (
            lambda d: d.update(
                running=[{"job_id": 1, "attempt": 1, "state": "odd", "started_at": 0}]
            ),
            "running[0].state: 'odd' is not one of starting, running, paused, stopping",
        ),
        (
            lambda d: d.update(
                results=[{"job_id": 1, "attempt": 1, "outcome": "won", "ended_at": 0}]
            ),
            "results[0].outcome: 'won' is not one of exited, killed",
        ),
        (lambda d: d.update(samples=[["util_pct", 1.0]]), "samples[0]: expected [metric"),
        (lambda d: d.update(samples=[[]] * (MAX_ITEMS + 1)), f"more than {MAX_ITEMS} entries"),
        (lambda d: d.update(node="a\x00b"), "node: contains a NUL character"),
        (lambda d: d.update(info={"kind": "gpu"}), "info.cores: required"),
    ],
)
def test_a_bad_request_names_the_field(change, message):
    data = json.loads(SyncRequest(node="n", instance="i", seq=1, sent_at=0.0).to_json())
    change(data)
    with pytest.raises(ProtocolError) as exc:
        SyncRequest.from_json(json.dumps(data))
    assert message in str(exc.value)


def test_a_body_that_is_not_json_is_refused():
    with pytest.raises(ProtocolError, match="not JSON"):
        SyncRequest.from_json(b"\xff{")


def test_a_reply_with_inconsistent_gang_ranks_is_refused():
    data = json.loads(SyncReply("n", 20.0, 5.0, 1.0, desired=(_spec(node_rank=5),)).to_json())
    with pytest.raises(ProtocolError, match=r"desired\[0\]\.node_rank: 5 but only 2 parts"):
        SyncReply.from_json(data)
    data = json.loads(SyncReply("n", 20.0, 5.0, 1.0, desired=(_spec(),)).to_json())
    data["desired"][0]["parts"][1]["node_rank"] = 3
    with pytest.raises(ProtocolError, match="node ranks must be 0..1 in order"):
        SyncReply.from_json(data)
    data["desired"][0]["parts"][1]["node_rank"] = 1
    data["desired"][0]["env"] = {"A=B": "x"}
    with pytest.raises(ProtocolError, match="bad variable name"):
        SyncReply.from_json(data)


def test_unknown_fields_are_ignored_so_newer_peers_can_add_some():
    data = json.loads(SyncRequest(node="n", instance="i", seq=1, sent_at=0.0).to_json())
    data["something_new"] = {"x": 1}
    assert SyncRequest.from_json(data).node == "n"


def test_a_refusing_reply_is_not_applied():
    assert not SyncReply("n", 20.0, 5.0, 1.0, send_info=True).applied
    reply = SyncReply.from_json(SyncReply("n", 20.0, 5.0, 1.0, resync_from=99).to_json())
    assert reply.resync_from == 99 and not reply.applied


def test_the_nudge_channel_is_per_node():
    assert nudge_channel("gpu-1") == "cosched:nudge:gpu-1" != nudge_channel("gpu-2")
