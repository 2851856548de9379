"""hetero_srtf's free GPUs of one model (``scheduler.policies.hetero_srtf_gpus.FreeGpus``)."""

from __future__ import annotations

from scheduler.policies.hetero_srtf_gpus import FreeGpus


def test_best_fit_takes_the_fullest_node_that_holds_the_job_and_accepts_it() -> None:
    free = FreeGpus()
    free.fill("a", [0, 1, 2, 3])
    free.fill("b", [2, 3])
    free.fill("c", [5])
    assert free.total() == 7
    assert free.best_fit(1, lambda n: True) == "c"
    assert free.best_fit(2, lambda n: True) == "b"
    assert free.best_fit(2, lambda n: n != "b") == "a"
    assert free.best_fit(5, lambda n: True) is None


def test_take_and_add_keep_the_counts_and_buckets_in_step() -> None:
    free = FreeGpus()
    free.fill("a", [0, 1, 2, 3])
    assert free.take("a", 3) == (0, 1, 2)
    assert free.total() == 1 and free.best_fit(2, lambda n: True) is None
    free.add("a", 1)
    free.add("a", 1)  # already free: no change
    assert free.total() == 2 and free.free["a"] == [1, 3]
    assert free.best_fit(2, lambda n: True) == "a"
    assert free.take("a", 2) == (1, 3)
    assert free.total() == 0 and "a" not in free.free and free.most_free(lambda n: True) == []
