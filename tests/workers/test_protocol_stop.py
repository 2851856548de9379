"""The protocol's part in time limits and preemption: an attempt's time limit, the stop grace
and the ``time_limit`` outcome (workers.protocol)."""

from __future__ import annotations

import json

import pytest

from workers.protocol import (
    DEFAULT_STOP_GRACE_S,
    OUTCOMES,
    AttemptResult,
    AttemptSpec,
    GangPart,
    ProtocolError,
    SyncReply,
)


def _reply(**spec) -> SyncReply:
    attempt = AttemptSpec(
        job_id=3, attempt=2, launch=True, paused=False, command="x",
        parts=(GangPart("n", 0),), **spec,
    )  # fmt: skip
    return SyncReply(
        node="n", lease_s=20.0, lease_kill_grace_s=5.0, sync_interval_s=1.0,
        desired=(attempt,), stop_grace_s=2.5,
    )  # fmt: skip


def test_the_time_limit_and_the_stop_grace_survive_the_json_form():
    reply = _reply(time_limit_s=3600.0)
    again = SyncReply.from_json(reply.to_json())
    assert again == reply
    assert again.stop_grace_s == 2.5 and again.desired[0].time_limit_s == 3600.0
    assert SyncReply.from_json(_reply().to_json()).desired[0].time_limit_s is None


def test_an_older_portal_without_a_stop_grace_gets_the_default():
    data = json.loads(_reply().to_json())
    del data["stop_grace_s"]
    assert SyncReply.from_json(data).stop_grace_s == DEFAULT_STOP_GRACE_S
    data["stop_grace_s"] = -3
    assert SyncReply.from_json(data).stop_grace_s == 0.0


@pytest.mark.parametrize("bad", [0, -1, "1h", True])
def test_a_bad_time_limit_is_refused_naming_the_field(bad):
    data = json.loads(_reply().to_json())
    data["desired"][0]["time_limit_s"] = bad
    with pytest.raises(ProtocolError, match=r"desired\[0\]\.time_limit_s"):
        SyncReply.from_json(data)


def test_time_limit_is_an_outcome_a_result_may_carry():
    assert "time_limit" in OUTCOMES
    result = AttemptResult(3, 2, "time_limit", 1.0, -15, "time limit 00:00:01 reached")
    assert AttemptResult.read(result.to_dict(), "r") == result and not result.succeeded
