"""The emulator's checkpoints (docs/preemption.md): saved in ``COSCHED_CHECKPOINT_DIR`` on
SIGTERM and periodically, and resumed by the next attempt. Real processes."""

from __future__ import annotations

import json
import signal
import time

from tests.workers.test_emulate import emulator, events, run_emulator
from workers.emulate import read_checkpoint, write_checkpoint
from workers.report_lines import parse_report

ARGS = ("--profile", "ck", "--duration", "3", "--iterations", "30", "--report-every", "0.1")


def _env(directory, attempt: str) -> dict[str, str]:
    return {"COSCHED_CHECKPOINT_DIR": str(directory), "COSCHED_ATTEMPT": attempt}


def _terminate_after(directory, fraction: float) -> tuple[int, list, float]:
    """Run attempt 1 until its progress passes ``fraction``, then SIGTERM it."""
    proc = emulator(*ARGS, "--checkpoint-every", "0", env=_env(directory, "1"))
    assert proc.stdout is not None
    reports = []
    for line in proc.stdout:
        report = parse_report(line)
        if report is None:
            continue
        reports.append(report)
        if report.event == "progress" and report.fields["fraction"] >= fraction:
            proc.send_signal(signal.SIGTERM)
            break
    out, _ = proc.communicate(timeout=10)
    reports += [r for r in map(parse_report, out.splitlines()) if r is not None]
    return proc.returncode, reports, time.monotonic()


def test_sigterm_saves_the_progress_and_the_next_attempt_resumes_from_it(tmp_path):
    code, reports, _ = _terminate_after(tmp_path, 0.3)
    assert code == 143
    saved = json.loads((tmp_path / "emulate.json").read_text())
    assert saved["profile"] == "ck" and saved["attempt"] == "1"
    assert 0.3 <= saved["fraction"] < 1.0
    (term,) = events(reports, "term")
    (point,) = events(reports, "checkpoint")
    assert point.fields["fraction"] == round(saved["fraction"], 6) <= term.fields["fraction"] + 1e-4

    started = time.monotonic()
    code, reports, _ = run_emulator(*ARGS, env=_env(tmp_path, "2"))
    took = time.monotonic() - started
    assert code == 0
    (start,) = events(reports, "start")
    assert start.fields["resumed_from"] == round(saved["fraction"], 6)
    first = events(reports, "progress")[0]
    assert first.fields["fraction"] >= 0.3 and first.fields["iter"] >= 9  # not from 0
    assert events(reports, "done")
    assert took < 3.0 * (1 - 0.3) + 1.5  # only the rest of the work (and a start-up)
    assert 3 * 0.3 <= events(reports, "done")[0].fields["active_s"] <= 3.05


def test_periodic_checkpoints_survive_a_sigkill(tmp_path):
    proc = emulator(*ARGS, "--checkpoint-every", "0.3", env=_env(tmp_path, "1"))
    deadline = time.monotonic() + 10
    while read_checkpoint(str(tmp_path), "ck") < 0.2 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()  # no chance to save on the way out
    proc.communicate(timeout=10)
    assert read_checkpoint(str(tmp_path), "ck") >= 0.2


def test_a_checkpoint_of_another_profile_an_unreadable_one_or_no_resume_start_from_zero(tmp_path):
    write_checkpoint(str(tmp_path), "other", 0.8, "1")
    code, reports, _ = run_emulator(*ARGS, env=_env(tmp_path, "2"))
    assert code == 0 and events(reports, "start")[0].fields["resumed_from"] == 0

    write_checkpoint(str(tmp_path), "ck", 0.5, "1")
    code, reports, _ = run_emulator(*ARGS, "--no-resume", env=_env(tmp_path, "2"))
    assert code == 0 and events(reports, "start")[0].fields["resumed_from"] == 0

    (tmp_path / "emulate.json").write_text("{not json")
    assert read_checkpoint(str(tmp_path), "ck") == 0.0
    (tmp_path / "emulate.json").write_text('{"profile": "ck", "fraction": 7}')
    assert read_checkpoint(str(tmp_path), "ck") == 0.0
    assert read_checkpoint(None, "ck") == 0.0


def test_without_a_checkpoint_dir_nothing_is_written(tmp_path):
    code, reports, _ = run_emulator(*ARGS, "--checkpoint-every", "0.2")
    assert code == 0 and not events(reports, "checkpoint")
    code, _, err = run_emulator(*ARGS, "--checkpoint-every", "-1")
    assert code == 2 and "--checkpoint-every" in err
