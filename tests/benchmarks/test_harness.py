"""The benchmark runner and its server helpers: percentiles, missing and failing benchmarks,
scratch databases and gunicorn being cleaned up even when the benchmark body fails."""

from __future__ import annotations

import os
import sys
import urllib.request

import psycopg
import pytest

from benchmarks import __main__ as runner
from benchmarks._servers import (
    PG_ADMIN_URL,
    collect_static,
    free_port,
    gunicorn,
    percentile,
    portal_env,
    scratch_database,
)


def test_percentile_interpolates_between_ranks():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]  # order must not matter
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 3.0
    assert percentile(values, 25) == 2.0
    assert percentile(values, 90) == pytest.approx(4.6)
    assert percentile(values, 100) == 5.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile(values, 101)


@pytest.fixture
def fake_benchmarks(tmp_path, monkeypatch):
    """Three registered benchmarks in a throw-away package: one fine, one raising, one absent."""
    package = tmp_path / "fakebench"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "fine.py").write_text(
        "def run(quick=False):\n"
        "    print('fine table')\n"
        "    return {'summary': {'widgets per s': 10 if quick else 1000}}\n"
    )
    (package / "broken.py").write_text(
        "def run(quick=False):\n    raise RuntimeError('the broken benchmark broke')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(
        runner,
        "BENCHMARKS",
        {"broken": "fakebench.broken", "absent": "fakebench.absent", "fine": "fakebench.fine"},
    )
    yield
    for name in [m for m in sys.modules if m.startswith("fakebench")]:
        del sys.modules[name]


def test_a_missing_or_failing_benchmark_is_reported_and_the_others_still_run(
    fake_benchmarks, capsys, tmp_path
):
    out_json = tmp_path / "results.json"
    code = runner.main(["--quick", "--json", str(out_json)])
    out, err = capsys.readouterr()
    assert code == 1
    assert "the broken benchmark broke" in err and "Traceback" in err
    assert "module fakebench.absent not found" in err
    summary = out[out.index("Summary") :]
    assert "broken     FAILED   RuntimeError: the broken benchmark broke" in summary
    assert "absent     MISSING" in summary
    assert "fine       OK" in summary and "widgets per s" in summary and "10" in summary
    assert "fine table" in out  # the benchmark's own output
    assert "nproc" in out and "python" in out  # machine facts in the header
    results = out_json.read_text()
    assert '"status": "ok"' in results and '"widgets per s": 10' in results


def test_only_the_named_benchmarks_run_and_all_ok_exits_0(fake_benchmarks, capsys):
    assert runner.main(["fine"]) == 0
    out = capsys.readouterr().out
    assert "widgets per s" in out and "1,000" in out
    assert "broken" not in out[out.index("Summary") :]


def test_an_unknown_name_is_a_usage_error(fake_benchmarks, capsys):
    with pytest.raises(SystemExit) as exit_info:
        runner.main(["nonsense"])
    assert exit_info.value.code == 2
    assert "unknown benchmark(s): nonsense" in capsys.readouterr().err


def _database_exists(name: str) -> bool:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        row = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    return row is not None


def test_scratch_database_is_created_empty_and_dropped_even_after_an_error():
    name = "cosched_bench_selftest"
    with pytest.raises(RuntimeError, match="inside"), scratch_database(name) as url:
        assert url.endswith(f"/{name}")
        with psycopg.connect(url) as conn:  # left open on purpose: the drop must still work
            conn.execute("CREATE TABLE t (x int)")
            assert _database_exists(name)
            raise RuntimeError("inside")
    assert not _database_exists(name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        return [int(child) for child in children.read().split()]


def test_gunicorn_answers_and_it_and_its_workers_stop_when_the_body_fails():
    # No database is touched to answer the log-in page, so none is needed here.
    env = portal_env("postgres://postgres@127.0.0.1:5432/cosched_bench_unused")
    collect_static(env)
    pids: list[int] = []
    with (
        pytest.raises(RuntimeError, match="benchmark failed"),
        gunicorn(env, free_port(), workers=2) as server,
    ):
        with urllib.request.urlopen(f"{server.url}/login/", timeout=10) as response:
            assert response.status == 200
        pids = [server.pid, *_children(server.pid)]
        assert len(pids) == 3  # the master and two workers
        raise RuntimeError("benchmark failed")
    assert pids and not any(_alive(pid) for pid in pids)


def test_the_api_farm_reports_its_median_round_and_every_round():
    from benchmarks.api_latency import _median_round

    rounds = [
        {"requests_per_s": 90.0, "p99_ms": 600.0},
        {"requests_per_s": 130.0, "p99_ms": 350.0},
        {"requests_per_s": 110.0, "p99_ms": 480.0},
    ]
    chosen = _median_round(rounds)
    assert chosen["requests_per_s"] == 110.0 and chosen["p99_ms"] == 480.0
    assert chosen["rounds"] == 3
    assert chosen["requests_per_s_all"] == [90.0, 130.0, 110.0]
    # An even count takes the lower middle round (never flatters).
    assert _median_round(rounds[:2])["requests_per_s"] == 90.0


def test_the_api_farm_reads_a_process_cpu_time_from_proc():
    import subprocess
    import time

    from benchmarks.api_latency import _process_cpu_s

    if not os.path.isdir("/proc/self"):
        pytest.fail("this test reads /proc (Linux)")
    marker = "cpu-burner-for-the-api-benchmark-test"
    burn = f"import time\nt=time.process_time()\nwhile time.process_time()-t<3: pass # {marker}"
    done = subprocess.Popen([sys.executable, "-c", burn])
    try:
        time.sleep(0.3)
        early = _process_cpu_s(lambda command: marker in command)
        time.sleep(0.6)
        late = _process_cpu_s(lambda command: marker in command)
    finally:
        done.kill()
        done.wait(10)
    assert early is not None and late is not None
    assert late > early and late >= 0.3
    assert _process_cpu_s(lambda command: "no-such-process-anywhere" in command) == 0.0


def test_the_api_benchmark_refuses_zero_rounds(capsys):
    from benchmarks.api_latency import main

    with pytest.raises(SystemExit) as stop:
        main(["--rounds", "0"])
    assert stop.value.code == 2
    assert "--rounds: give 1 or more" in capsys.readouterr().err
