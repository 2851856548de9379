"""The simulator's trace and cluster readers on hostile input (issue 12, part 4): each case is
one ``file:line: field ...`` error, never a traceback, and nothing is half read."""

from __future__ import annotations

import os
import re

import pytest

from scheduler import simulate
from scheduler.cluster_spec import load_cluster_spec
from scheduler.inputs import InputError
from scheduler.traces import load_profiles, read_profile_trace, read_trace

GAVEL = "job_id,job_type,arrival_time_s,total_steps,scale_factor\n"
GOOD_ROW = "0,A3C,0,10,1\n"
PROFILE_TRACE = "job_id,arrival_s,profile,gpus,cpus\n"
PROFILES = "profiles:\n  - {name: p, gpu_time_s: {V100: 10}, cpu_time_s: 20}\n"
CLUSTER = "nodes:\n  - {name: v, gpu_model: V100, gpus_per_node: 4}\n"


def write(tmp_path, name: str, content: str | bytes):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8", errors="surrogatepass")
    return path


def error_of(fn, *args) -> InputError:
    with pytest.raises(InputError) as err:
        fn(*args)
    return err.value


# Gavel trace rows after a good first row (so the bad one is on line 3).
GAVEL_CASES = [
    ("int >= 2^31", "1,A3C,0,10,2147483648", "scale_factor", "must be <= 1000000"),
    ("huge int", "1,A3C,0,10,99999999999999999999999999", "scale_factor", "must be <="),
    ("absurd time", "1,A3C,1e300,10,1", "arrival_time_s", "must be <= 1e+10"),
    ("absurd steps", "1,A3C,0,1e30,1", "total_steps", "must be <= 1e+15"),
    ("NUL", "1,A\x00C,0,10,1", "job_type", "contains a NUL character (at character 2)"),
    ("zero work", "1,A3C,0,0,1", "total_steps", "must be > 0"),
    ("negative", "1,A3C,-3,10,1", "arrival_time_s", "must be >= 0"),
    ("nan", "1,A3C,nan,10,1", "arrival_time_s", "expected a finite number"),
    ("inf", "1,A3C,0,inf,1", "total_steps", "expected a finite number"),
    ("negative weight", "1,A3C,0,10,1,,,-1", "priority_weight", "must be >= 0"),
    ("5 KB cell", "1," + "A" * 5000 + ",0,10,1", "job_type", "5,000 characters; at most 4,096"),
]


@pytest.mark.parametrize(
    ("case", "row", "field", "words"), GAVEL_CASES, ids=[c[0] for c in GAVEL_CASES]
)
def test_gavel_trace_errors_name_file_line_and_field(tmp_path, case, row, field, words):
    header = (
        GAVEL if "weight" not in case else GAVEL.strip() + ",model,batch_size,priority_weight\n"
    )
    path = write(tmp_path, "t.csv", header + GOOD_ROW + row + "\n")
    err = error_of(read_trace, path)
    assert (err.file, err.line, err.field) == (str(path), 3, field)
    assert str(err).startswith(f"{path}:3: field '{field}': ") and words in str(err)
    assert "\n" not in str(err) and len(str(err)) < 300  # one line, however big the cell


def test_bytes_that_are_not_utf8_and_lone_surrogates(tmp_path):
    # A lone surrogate cannot be encoded in UTF-8: files carry it as invalid bytes (CESU-8).
    path = write(tmp_path, "t.csv", (GAVEL + GOOD_ROW).encode() + b"1,A\xed\xa0\x80C,0,10,1\n")
    err = error_of(read_trace, path)
    assert (err.line, err.field) == (3, "job_type")
    assert "is not valid UTF-8 (byte 0xed at character 2)" in str(err)
    latin1 = write(tmp_path, "l.csv", (GAVEL + GOOD_ROW).encode() + b"1,caf\xe9,0,10,1\n")
    assert "byte 0xe9" in str(error_of(read_trace, latin1))


def test_a_200_kb_cell_names_its_line_and_column(tmp_path):
    path = write(tmp_path, "t.csv", GAVEL + GOOD_ROW + "1,A3C," + "9" * 200_000 + ",10,1\n")
    err = error_of(read_trace, path)
    assert (err.line, err.field) == (3, "arrival_time_s")
    assert "a line of 200,012 characters; at most 65,536" in str(err)


@pytest.mark.parametrize(
    "blob",
    [
        os.urandom(4096),
        b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8,
        "utf16,text\n".encode("utf-16"),
    ],
    ids=["random", "png", "utf-16"],
)
def test_binary_files_are_refused_at_once(tmp_path, blob):
    trace = write(tmp_path, "t.csv", blob)
    err = error_of(read_trace, trace)
    assert err.line == 1 and "not a text file" in str(err)
    cluster = write(tmp_path, "c.yaml", blob)
    assert "not a text file" in str(error_of(load_cluster_spec, cluster))


PROFILE_TRACE_CASES = [
    ("gpus >= 2^31", "1,0,p,4294967296,1", "gpus", "must be <="),
    ("negative gpus", "1,0,p,-1,1", "gpus", "must be >= 0"),
    ("cores over the bound", "1,0,p,1,2147483647", "cpus", "must be <= 1000000"),
    ("NUL in an id", "1\x00,0,p,1,1", "job_id", "NUL"),
    ("lone surrogate", "1,0,p\udc80,1,1", "profile", "not valid UTF-8 (byte 0xed"),
]


@pytest.mark.parametrize(
    ("case", "row", "field", "words"), PROFILE_TRACE_CASES, ids=[c[0] for c in PROFILE_TRACE_CASES]
)
def test_profile_trace_errors(tmp_path, case, row, field, words):
    profiles = write(tmp_path, "p.yaml", PROFILES)
    path = write(tmp_path, "t.csv", PROFILE_TRACE + "0,0,p,1,1\n" + row + "\n")
    err = error_of(read_profile_trace, path, profiles)
    assert (err.line, err.field) == (3, field) and words in str(err)


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        ("  - {name: z, cpu_time_s: 0}\n", 3, "profiles[1].cpu_time_s", "must be > 0"),
        ("  - {name: z, gpu_time_s: {V100: -1}}\n", 3, "profiles[1].gpu_time_s", ">= 0"),
        ("  - {name: z, gpu_util_pct: .nan}\n", 3, "profiles[1].gpu_util_pct", "finite"),
        ('  - {name: "z\\ud800"}\n', 3, "profiles[1].name", "lone surrogate (U+D800"),
        ('  - {name: "z\\0"}\n', 3, "profiles[1].name", "NUL"),
    ],
)
def test_profile_yaml_errors(tmp_path, text, line, field, words):
    path = write(tmp_path, "p.yaml", PROFILES + text)
    err = error_of(load_profiles, path)
    assert (err.line, err.field) == (line, field) and words in str(err)


@pytest.mark.parametrize(
    ("group", "field", "words"),
    [
        ("{name: v, gpu_model: V100, cpus: 2147483648}", "nodes[1].cpus", "must be <= 1000000"),
        ("{name: v, gpu_model: V100, count: 1e9}", "nodes[1].count", "must be <= 100000"),
        ("{name: v, gpu_model: V100, gpus_per_node: 5000}", "nodes[1].gpus_per_node", "<= 1024"),
        ("{name: v, gpu_model: V100, memory_mb: -5}", "nodes[1].memory_mb", ">= 0"),
        ("{name: v, gpu_model: V100, memory_mb: .inf}", "nodes[1].memory_mb", "finite"),
        ('{name: "v\\ud800", gpu_model: V100}', "nodes[1].name", "lone surrogate"),
        ('{name: "v\\0", gpu_model: V100}', "nodes[1].name", "NUL"),
    ],
)
def test_cluster_errors_name_file_line_and_field(tmp_path, group, field, words):
    path = write(tmp_path, "c.yaml", CLUSTER + f"  - {group}\n")
    err = error_of(load_cluster_spec, path)
    assert (err.file, err.line, err.field) == (str(path), 3, field)
    assert words in str(err)


def test_cluster_with_a_raw_nul_or_bad_bytes(tmp_path):
    raw_nul = write(tmp_path, "n.yaml", CLUSTER + "  - {name: w\x00, gpu_model: V100}\n")
    err = error_of(load_cluster_spec, raw_nul)
    assert err.line == 3 and "unacceptable character #x0000" in str(err)
    bad = write(tmp_path, "b.yaml", CLUSTER.encode() + b"  - {name: w\xff, gpu_model: V100}\n")
    err = error_of(load_cluster_spec, bad)
    assert err.line == 3 and "not valid UTF-8 (byte 0xff)" in str(err)


def test_the_command_line_prints_one_line_and_exits_2(tmp_path, capsys):
    cluster = write(tmp_path, "c.yaml", CLUSTER)
    cases = {
        "nul.csv": GAVEL + "0,A\x00C,0,10,1\n",
        "bin.csv": os.urandom(3000),
        "zero.csv": GAVEL + "0,A3C,0,0,1\n",
        "big.csv": GAVEL + "0,A3C,0,10,4294967296\n",
    }
    for name, content in cases.items():
        trace = write(tmp_path, name, content)
        code = simulate.main(["--trace", str(trace), "--cluster", str(cluster), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2, name
        assert re.fullmatch(rf"error: {re.escape(str(trace))}:\d+: .+\n", err), err
    bad_cluster = write(tmp_path, "bad.yaml", CLUSTER + "  - {name: x, count: 1e12}\n")
    trace = write(tmp_path, "ok.csv", GAVEL + GOOD_ROW)
    code = simulate.main(["--trace", str(trace), "--cluster", str(bad_cluster), "--quiet"])
    assert code == 2
    assert "bad.yaml:3: field 'nodes[1].count'" in capsys.readouterr().err
