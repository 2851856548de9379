"""Cluster spec YAML: expansion, catalogue overrides, errors with file, line and field."""

from __future__ import annotations

import pytest

from scheduler.catalog import CATALOG
from scheduler.cluster_spec import load_cluster_spec
from scheduler.domain import NodeKind, SharingMode
from scheduler.inputs import InputError

GOOD = """\
gpu_models:
  V100: {memory_mb: 32768}
  MyGPU: {architecture: Hopper, memory_mb: 1000, sm_count: 10, dram_bw_gbps: 1,
          peak_gflops: 2, sharing_modes: [exclusive, mps]}
nodes:
  - {name: v, count: 2, gpu_model: v100, gpus_per_node: 4, cpus: 32}
  - {name: titan, gpu_model: Titan Xp}
  - {name: mine, gpu_model: MyGPU, gpus_per_node: 2}
  - {name: cpu, count: 3, cpus: 16}
"""


def write(tmp_path, text):
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def test_groups_expand_into_named_nodes_with_overrides(tmp_path):
    spec = load_cluster_spec(write(tmp_path, GOOD))
    names = [n.name for n in spec.nodes]
    assert names == ["v-0", "v-1", "titan-0", "mine-0", "cpu-0", "cpu-1", "cpu-2"]
    assert spec.gpu_count == 2 * 4 + 1 + 2
    v = spec.nodes[0]
    assert (v.gpu_model, v.gpu_count, v.cores, v.kind) == ("V100", 4, 32, NodeKind.GPU)
    assert spec.gpu_spec("V100").memory_mb == 32768
    assert spec.gpu_spec("V100").sm_count == CATALOG["V100"].sm_count  # others kept
    assert CATALOG["V100"].memory_mb != 32768  # the catalogue itself is untouched
    assert spec.nodes[2].gpu_model == "TitanXp"
    assert spec.gpu_spec("MyGPU").sharing_modes == (SharingMode.EXCLUSIVE, SharingMode.MPS)
    cpu = spec.nodes[-1]
    assert (cpu.kind, cpu.gpu_count, cpu.cores) == (NodeKind.CPU, 0, 16)
    states = spec.initial_nodes()
    assert len(states[0].gpus) == 4 and states[0].gpus[3].index == 3
    assert states[0].gpus[0].spec.memory_mb == 32768
    assert states[-1].gpus == () and states[-1].free_cores == 16


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        ("nodes:\n  - {name: a, gpu_model: Z80}\n", 2, "nodes[0].gpu_model", "unknown GPU model"),
        ("nodes:\n  - name: a\n    count: two\n", 3, "nodes[0].count", "expected a number"),
        ("nodes:\n  - name: a\n    count: 0\n", 3, "nodes[0].count", ">= 1"),
        ("nodes:\n  - {name: a}\n  - {name: b, gpus: 4}\n", 3, "nodes[1].gpus", "unknown field"),
        ("nodes:\n  - {count: 2}\n", 2, "nodes[0].name", "needs a name"),
        ("nodes:\n  - {name: a}\n  - {name: a}\n", 3, "nodes[1].name", "used twice"),
        ("nodes:\n  - {name: a, gpus_per_node: 2}\n", 2, "nodes[0].gpus_per_node", "gpu_model"),
        ("nodes: []\n", 1, "nodes", "non-empty"),
        (
            "gpu_models:\n  V100:\n    memory: 3\nnodes: [{name: a}]\n",
            3,
            "gpu_models.V100.memory",
            "unknown GPU field",
        ),
        (
            "gpu_models:\n  New: {memory_mb: 3}\nnodes: [{name: a}]\n",
            2,
            "gpu_models.New",
            "needs architecture",
        ),
        (
            "gpu_models:\n  V100: {sharing_modes: [teleport]}\nnodes: [{name: a}]\n",
            2,
            "gpu_models.V100.sharing_modes",
            "unknown sharing mode",
        ),
        ("nodes:\n  - {name: a\n", 3, None, "bad YAML"),
        ("racks: 3\nnodes: [{name: a}]\n", 1, "racks", "unknown section"),
    ],
)
def test_errors_name_file_line_and_field(tmp_path, text, line, field, words):
    path = write(tmp_path, text)
    with pytest.raises(InputError) as err:
        load_cluster_spec(path)
    assert (err.value.line, err.value.field) == (line, field)
    assert words in str(err.value)
    assert str(err.value).startswith(f"{path}:{line}")


def test_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        load_cluster_spec(tmp_path / "nope.yaml")
