"""Training samples from the Gavel measurements (scheduler.learning.datasets)."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from scheduler.learning.datasets import (
    GAVEL_DIR,
    DatasetError,
    application_of,
    gavel_training_set,
    pytorch_samples,
    reference_repository,
    tf_samples,
)
from scheduler.learning.features import REFERENCE_JOB_TYPES


def test_tf_family_joins_nvprof_profiles_with_both_orientations_of_each_run():
    samples = tf_samples()
    co = pd.read_csv(GAVEL_DIR / "tf_colocation_2019.csv")
    used = co[co["log"] != "k80_reduced_minibatch_sizes"]
    assert len(samples) == 2 * len(used)
    infeasible = [s for s in samples if s.norm is None]
    assert len(infeasible) == 2 * int((used["feasible"] == 0).sum())
    vgg = next(s for s in samples if s.a.name == "tf:vgg16" and s.gpu.model == "K80")
    # V100 kernel metrics of the same model, wherever the pair ran
    nv = pd.read_csv(GAVEL_DIR / "nvprof_summary.csv")
    row = nv[(nv.profile_set == "v100") & (nv.model_dir == "vgg16")].iloc[0]
    assert vgg.a.sm_efficiency_pct == pytest.approx(row.sm_efficiency)
    assert vgg.a.dram_bw_gbps == pytest.approx(row.dram_read_throughput + row.dram_write_throughput)
    assert vgg.app_a == "tf:vgg16" and vgg.family == "tf"
    assert set(vgg.a.gpu_time_s) == {"K80", "P100", "V100"}


def test_pytorch_family_has_a_cheap_profile_and_flags_reference_pairs():
    samples = pytorch_samples()
    assert len(samples) == len(pd.read_csv(GAVEL_DIR / "colocation.csv"))
    s = next(x for x in samples if x.type_a == "ResNet-50 (batch size 64)")
    assert s.a.batch_size == 64 and s.app_a == "pt:ResNet-50"
    assert {"K80", "P100", "V100"} >= set(s.a.gpu_time_s)
    refs = set(REFERENCE_JOB_TYPES)
    assert all(x.reference_pair == (x.type_a in refs or x.type_b in refs) for x in samples)
    repo = reference_repository()
    entry = repo["ResNet-50 (batch size 64)"]
    assert set(entry) == {f"sens:{r}" for r in refs} | {f"intens:{r}" for r in refs}
    assert all(0.0 <= v <= 1.5 for v in entry.values())


def test_application_strips_the_batch_size():
    assert application_of("LM (batch size 20)") == "pt:LM"
    assert application_of("A3C") == "pt:A3C"


def test_excluded_pairs_leave_both_orientations_on_every_gpu():
    pair = frozenset(("LM (batch size 5)", "A3C"))
    kept = pytorch_samples(exclude_pairs=[pair])
    assert not any(frozenset((s.type_a, s.type_b)) == pair for s in kept)
    only = pytorch_samples(only_pairs=[pair])
    assert len(only) == 6  # 2 orientations x 3 GPU types
    assert len(kept) + len(only) == len(pytorch_samples())


def test_training_set_matrices_and_digest():
    data = gavel_training_set(families=("tf",))
    assert data.a.shape == (len(data), 24) and data.g.shape == (len(data), 4)
    assert data.feasible.sum() == (~pd.isna(data.norm)).sum()
    again = gavel_training_set(families=("tf",))
    assert again.digest() == data.digest()
    fewer = data.subset(data.family == "tf")
    assert fewer.digest() == data.digest()
    assert data.subset(data.app_a != "tf:vgg16").digest() != data.digest()


def test_bad_files_name_the_file(tmp_path):
    for name in (
        "nvprof_summary.csv",
        "tf_colocation_2019.csv",
        "colocation.csv",
        "solo_throughput.csv",
    ):
        shutil.copy(GAVEL_DIR / name, tmp_path / name)
    (tmp_path / "colocation.csv").write_text("gpu_type,job_a\nv100,x\n")
    with pytest.raises(DatasetError, match="colocation.csv: missing column"):
        gavel_training_set(data_dir=tmp_path)
    with pytest.raises(DatasetError, match="unknown famil"):
        gavel_training_set(families=("tf", "jax"))
    (tmp_path / "nvprof_summary.csv").unlink()
    with pytest.raises(DatasetError, match="nvprof_summary.csv: file not found"):
        gavel_training_set(families=("tf",), data_dir=tmp_path)
