"""The wire format of every protocol message, pinned (workers.protocol).

``protocol_wire.json`` (next to this file) was written once by this module from the protocol as
it stood, and is committed: an agent of an older release talks to a newer portal (docs/upgrade.md),
so the JSON of a message must not change by accident. It holds

- ``messages``: the JSON of a representative instance of each message type, optional fields set
  and unset, lists filled; encoding the instance must give exactly that JSON, and reading that
  JSON must give back an equal instance;
- ``variants``: what reading a top-level message makes of one field changed (absent, null, of
  another type, out of range): the error text, or the fields that read differently.

After a deliberate change of the protocol, rewrite the file with
``PYTHONPATH=. python tests/workers/test_protocol_wire.py --write`` and review its diff.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from workers.protocol import (
    AttemptKey,
    AttemptResult,
    AttemptSpec,
    GangPart,
    LogChunk,
    LogTail,
    NodeInfo,
    ProtocolError,
    ResultAck,
    ResultReport,
    RunningAttempt,
    Sample,
    SyncReply,
    SyncRequest,
)

FIXTURE = Path(__file__).with_name("protocol_wire.json")

_PART_A = GangPart("a", 0, (0, 1), 4, "10.0.0.1")
_PART_B = GangPart("b", 1, (2, 3), 8, "10.0.0.2")
_SPEC_FULL = AttemptSpec(
    job_id=12,
    attempt=2,
    launch=True,
    paused=True,
    command="python train.py --epochs 3",
    parts=(_PART_A, _PART_B),
    node_rank=1,
    mode="mps",
    mps_percentage=40,
    mig_profile="1g.10gb",
    gpu_model="V100",
    env={"EXTRA": "1", "LANG": "C.UTF-8"},
    profile={"name": "resnet", "gpu_time_s": {"V100": 10.0}, "tags": ["a", "b"]},
    job_name="train",
    job_kind="dl-train",
    job_type="resnet50",
    gpu_memory_mb=2048.5,
    owner="alice",
    memory_mb=4096,
    time_limit_s=3600.0,
    process_per_gpu=True,
    master_port=29500,
    container_image="docker.io/library/python:3.12",
)
_SPEC_MIN = AttemptSpec(7, 1, False, False, "true", (GangPart("a", 0),))
_RESULT_FULL = AttemptResult(11, 1, "exited", 200.5, 0, "exit code 0", 150.25, "bye\n")
_RESULT_MIN = AttemptResult(11, 2, "lost", 201.0)
_INFO_FULL = NodeInfo(
    kind="gpu",
    cores=16,
    memory_mb=65536,
    backend="nvml",
    gpus=(
        {
            "index": 0,
            "uuid": "GPU-1",
            "model": "A30",
            "architecture": "ampere",
            "memory_mb": 24576,
            "sm_count": 56,
            "sharing_modes": ["exclusive", "mig"],
            "mig_profiles": {"1g.6gb": 4},
        },
        {"index": 1, "model": "A30", "memory_mb": 24576},
    ),
    address="10.0.0.2",
    isolation=(
        {"what": "accounts", "level": "ok", "text": "one account per user"},
        {"what": "gpu_devices", "level": "weak", "text": "no device cgroup"},
    ),
    container_runtimes=("podman", "apptainer"),
)
_INFO_MIN = NodeInfo("cpu", 2, 0, "virtual")

#: Name -> a representative instance. Nested messages are pinned on their own too.
MESSAGES: dict[str, Any] = {
    "AttemptKey": AttemptKey(11, 1),
    "GangPart full": _PART_B,
    "GangPart minimal": GangPart("a", 0),
    "AttemptSpec full": _SPEC_FULL,
    "AttemptSpec minimal": _SPEC_MIN,
    "RunningAttempt full": RunningAttempt(12, 2, "running", 100.0, 4242),
    "RunningAttempt minimal": RunningAttempt(12, 3, "starting", 101.5),
    "AttemptResult full": _RESULT_FULL,
    "AttemptResult minimal": _RESULT_MIN,
    "Sample full": Sample("progress", 0.5, 3.0, 1, 12, 2),
    "Sample minimal": Sample("util_pct", 50.0, 3.0),
    "LogTail": LogTail(12, 2, "hello\nworld"),
    "LogChunk": LogChunk(12, 2, 4096, "épsilon\n", 9),
    "NodeInfo full": _INFO_FULL,
    "NodeInfo minimal": _INFO_MIN,
    "SyncRequest full": SyncRequest(
        node="gpu-1",
        instance="abc123",
        seq=17,
        sent_at=1.5,
        running=(
            RunningAttempt(12, 2, "running", 100.0, 4242),
            RunningAttempt(13, 1, "paused", 9.0),
        ),
        results=(_RESULT_FULL, _RESULT_MIN),
        samples=(Sample("util_pct", 50.0, 3.0, 0), Sample("progress", 0.5, 3.0, None, 12, 2)),
        log_tails=(LogTail(12, 2, "hello"),),
        log_chunks=(LogChunk(12, 2, 0, "hello", 5),),
        info=_INFO_FULL,
        checkpoints=(3, 5),
    ),
    "SyncRequest minimal": SyncRequest(node="gpu-1", instance="abc123", seq=1, sent_at=0.0),
    "SyncRequest version 1": SyncRequest(node="old", instance="x", seq=2, sent_at=1.0, version=1),
    "SyncReply full": SyncReply(
        node="gpu-1",
        lease_s=20.0,
        lease_kill_grace_s=5.0,
        sync_interval_s=1.0,
        acked=(AttemptKey(11, 1), AttemptKey(11, 2)),
        desired=(_SPEC_FULL, _SPEC_MIN),
        send_info=True,
        resync_from=99,
        stop_grace_s=2.5,
        drop_checkpoints=(3,),
    ),
    "SyncReply minimal": SyncReply("gpu-1", 20.0, 5.0, 1.0),
    "ResultReport": ResultReport("gpu-1", (_RESULT_FULL, _RESULT_MIN)),
    "ResultAck full": ResultAck((AttemptKey(11, 1), AttemptKey(11, 2))),
    "ResultAck minimal": ResultAck(()),
}

_TOP_LEVEL = (SyncRequest, SyncReply, ResultReport, ResultAck)


def encode(message: Any) -> Any:
    """The JSON of a message: top-level ones as their exact text, nested ones as their object
    (``Sample`` as its list)."""
    if isinstance(message, _TOP_LEVEL):
        return message.to_json()
    if isinstance(message, Sample):
        return message.to_list()
    return message.to_dict()


def decode(kind: type, data: Any) -> Any:
    if kind in _TOP_LEVEL:
        return kind.from_json(data)
    return kind.read(data, "m")


# --- variants: one field of a top-level message changed ------------------------------------------

_ABSENT = object()
#: What a field is changed to: absent, null, and a value of each JSON type (some out of range).
_VALUES: dict[str, Any] = {
    "absent": _ABSENT,
    "null": None,
    "text": "x",
    "empty text": "",
    "zero": 0,
    "minus one": -1,
    "fraction": 1.5,
    "huge": 2**70,
    "true": True,
    "list": [],
    "object": {},
}


def _paths(data: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path in a message's JSON (lists: their first entry only)."""
    out = []
    if isinstance(data, dict):
        for key, value in data.items():
            out.append((*path, key))
            if key not in ("profile", "env"):  # free-form: not the protocol's own shape
                out.extend(_paths(value, (*path, key)))
    elif isinstance(data, list) and data:
        out.append((*path, 0))
        out.extend(_paths(data[0], (*path, 0)))
    return out


def _changed(data: Any, path: tuple[Any, ...], value: Any) -> Any:
    data = json.loads(json.dumps(data))
    holder = data
    for key in path[:-1]:
        holder = holder[key]
    if value is _ABSENT:
        if isinstance(holder, dict):
            del holder[path[-1]]
        else:
            holder.pop(path[-1])
    else:
        holder[path[-1]] = value
    return data


def _diff(before: Any, after: Any, path: str = "") -> dict[str, Any]:
    """Where ``after`` differs from ``before``: path -> the new value (``<absent>``: gone)."""
    if before == after and type(before) is type(after):
        return {}
    if isinstance(before, dict) and isinstance(after, dict):
        out: dict[str, Any] = {}
        for key in sorted(before.keys() | after.keys()):
            where = f"{path}.{key}" if path else key
            if key not in after:
                out[where] = "<absent>"
            elif key not in before:
                out[where] = after[key]
            else:
                out.update(_diff(before[key], after[key], where))
        return out
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        out = {}
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            out.update(_diff(b, a, f"{path}[{i}]"))
        return out
    return {path: after}


def read_variant(kind: type, original: dict[str, Any], data: Any) -> dict[str, Any]:
    """What reading ``data`` gives: the error, or the fields that differ from ``original``."""
    try:
        again = json.loads(kind.from_json(json.dumps(data)).to_json())
    except ProtocolError as exc:
        return {"error": str(exc)}
    return {"ok": _diff(original, again)}


def variants() -> list[dict[str, Any]]:
    out = []
    for name in ("SyncRequest full", "SyncReply full", "ResultReport", "ResultAck full"):
        message = MESSAGES[name]
        kind = type(message)
        original = json.loads(message.to_json())
        for path in _paths(original):
            for label, value in _VALUES.items():
                data = _changed(original, path, value)
                out.append(
                    {
                        "message": name,
                        "path": ".".join(map(str, path)),
                        "to": label,
                        "read": read_variant(kind, original, data),
                    }
                )
    return out


def specials() -> list[dict[str, Any]]:
    """Bodies that are not messages, and values no type change above gives."""
    request = json.loads(MESSAGES["SyncRequest minimal"].to_json())
    reply = json.loads(MESSAGES["SyncReply full"].to_json())
    bodies: list[tuple[str, type, str]] = [
        ("not JSON", SyncRequest, "\xff{"),
        ("a list", SyncRequest, "[]"),
        ("deep", SyncRequest, "[" * 100 + "]" * 100),
        ("NaN", SyncRequest, json.dumps(request | {"sent_at": float("nan")})),
        ("long name", SyncRequest, json.dumps(request | {"node": "n" * 201})),
        ("NUL", SyncRequest, json.dumps(request | {"node": "a\x00b"})),
        ("many", SyncRequest, json.dumps(request | {"checkpoints": [1] * (10_000 + 1)})),
    ]
    for kind in _TOP_LEVEL:
        data = json.loads(next(m for m in MESSAGES.values() if type(m) is kind).to_json())
        for version in (0, 1, 2, 3):
            bodies.append((f"version {version}", kind, json.dumps(data | {"version": version})))
    spec = reply["desired"][0]
    for label, change in [
        ("mps 101", {"mps_percentage": 101}),
        ("port 80", {"master_port": 80}),
        ("no parts", {"parts": []}),
        ("rank 2", {"node_rank": 2}),
        ("env A=B", {"env": {"A=B": "x"}}),
        ("env empty name", {"env": {"": "x"}}),
        ("env number", {"env": {"A": 1}}),
        ("profile list", {"profile": []}),
        ("gpu 4096", {"parts": [spec["parts"][0] | {"gpu_indices": [4096]}, spec["parts"][1]]}),
    ]:
        data = reply | {"desired": [spec | change]}
        bodies.append((label, SyncReply, json.dumps(data)))
    out = []
    for label, kind, text in bodies:
        try:
            again = json.loads(kind.from_json(text).to_json())
        except ProtocolError as exc:
            read: Any = {"error": str(exc)}
        else:
            read = {"ok": _diff(json.loads(text), again)}
        out.append({"message": kind.__name__, "body": label, "read": read})
    return out


def build() -> dict[str, Any]:
    return {
        "messages": {
            name: {"type": type(m).__name__, "json": encode(m)} for name, m in MESSAGES.items()
        },
        "variants": variants(),
        "specials": specials(),
    }


# --- tests ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pinned() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


def test_every_message_type_is_pinned(pinned):
    types = {entry["type"] for entry in pinned["messages"].values()}
    assert types == {type(m).__name__ for m in MESSAGES.values()}
    assert set(pinned["messages"]) == set(MESSAGES)


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_a_message_encodes_to_its_pinned_json(name, pinned):
    assert encode(MESSAGES[name]) == pinned["messages"][name]["json"]


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_the_pinned_json_reads_back_as_the_message(name, pinned):
    message = MESSAGES[name]
    assert decode(type(message), pinned["messages"][name]["json"]) == message


def test_bodies_that_are_not_messages_read_as_pinned(pinned):
    assert specials() == pinned["specials"]


def test_a_changed_field_reads_as_pinned(pinned):
    got = variants()
    assert len(got) == len(pinned["variants"])
    for now, then in zip(got, pinned["variants"], strict=True):
        assert now == then


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/workers/test_protocol_wire.py --write")
    pinned = build()
    lines = ",\n".join(json.dumps(v, ensure_ascii=False) for v in pinned["variants"])
    messages = json.dumps(pinned["messages"], indent=1, ensure_ascii=False)
    specials = ",\n".join(json.dumps(v, ensure_ascii=False) for v in pinned["specials"])
    FIXTURE.write_text(
        f'{{"messages": {messages},\n"variants": [\n{lines}\n],\n"specials": [\n{specials}\n]}}\n'
    )
    print(f"wrote {FIXTURE}")
