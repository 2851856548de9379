"""The training SDK on its own (no portal): batch splits, local timing, disabled client."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.sdk import TrainingClient, split_batch
from workers.sdk.client import Reply


@given(
    st.integers(0, 1_000_000),
    st.lists(st.integers(0, 10), min_size=1, max_size=16).filter(lambda r: sum(r) > 0),
)
def test_split_always_adds_up_to_the_global_batch(batch: int, ratios: list[int]) -> None:
    sizes = split_batch(batch, ratios)
    assert sum(sizes) == batch
    assert len(sizes) == len(ratios)
    assert all(s == 0 for s, r in zip(sizes, ratios, strict=True) if r == 0)
    # each size is within one item of its exact share
    total = sum(ratios)
    assert all(abs(s - batch * r / total) < 1 for s, r in zip(sizes, ratios, strict=True))


@given(st.integers(1, 10_000), st.lists(st.floats(0.01, 100), min_size=1, max_size=8))
def test_split_by_float_weights_adds_up_too(batch: int, weights: list[float]) -> None:
    assert sum(split_batch(batch, weights)) == batch


def test_split_examples() -> None:
    assert split_batch(256, [0, 7, 3, 0]) == [0, 179, 77, 0]
    assert split_batch(10, [1, 1, 1]) == [4, 3, 3]
    assert split_batch(0, [5, 5]) == [0, 0]


@pytest.mark.parametrize(
    ("batch", "ratios"), [(-1, [10]), (10, []), (10, [0, 0]), (10, [-1, 11]), (1.5, [10])]
)
def test_split_refuses_nonsense(batch, ratios) -> None:
    with pytest.raises(ValueError):
        split_batch(batch, ratios)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_without_cosched_the_client_is_disabled_and_the_job_goes_on() -> None:
    clock = Clock()
    client = TrainingClient(environ={}, clock=clock, data_ratio=[10, 0])
    assert not client.enabled
    for i in range(1, 11):
        clock.t += 2.0
        assert client.report(i, epoch_end=(i % 5 == 0)) is None
    assert client.data_ratio == (10, 0) and client.epoch == 2
    assert client.split(64) == [64, 0]
    assert TrainingClient(environ={}).split(7) == [7]


def test_a_non_http_url_is_refused() -> None:
    with pytest.raises(ValueError):
        TrainingClient(environ={"COSCHED_API_URL": "file:///etc/passwd", "COSCHED_JOB_TOKEN": "x"})


def test_an_unreachable_portal_keeps_the_ratio() -> None:
    clock = Clock()
    client = TrainingClient(
        "http://127.0.0.1:9", "cjt_1_1_x", clock=clock, data_ratio=[3, 7], timeout_s=0.5
    )
    clock.t += 1
    assert client.report(1, epoch_end=True) is None
    assert client.data_ratio == (3, 7) and client.last_error
    assert client.enabled  # a network failure is not a refusal: it tries again next epoch


def test_the_reply_keeps_unknown_keys_for_later_features() -> None:
    reply = Reply.from_json({"data_ratio": [5, 5], "workers": 4, "epoch": 2, "future": {"x": 1}})
    assert reply.data_ratio == (5, 5) and reply.workers == 4
    assert reply.raw["future"] == {"x": 1}


class Rows:
    """A stand-in with a tensor's ``shape`` and ``split(sizes, dim)`` (torch is not installed)."""

    def __init__(self, items: list[int]) -> None:
        self.items = items
        self.shape = (len(items),)

    def split(self, sizes: list[int], dim: int) -> list[list[int]]:
        assert dim == 0
        out, start = [], 0
        for n in sizes:
            out.append(self.items[start : start + n])
            start += n
        return out


def test_split_tensor_cuts_a_batch_by_the_ratio() -> None:
    from workers.sdk import split_tensor

    pieces = split_tensor(Rows(list(range(10))), [0, 7, 3, 0])
    assert pieces == [[], [0, 1, 2, 3, 4, 5, 6], [7, 8, 9], []]
