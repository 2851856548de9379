"""Data-parallel emulation (``python -m workers.emulate --data-parallel ...``): an emulated
training job that splits each mini-batch over the node's virtual GPUs by its data ratio and
talks to Cosched through the training SDK (``workers.sdk``), as a real job would.

**Speed.** The job's iteration takes ``w * ((1 - u) + u * max_g (DR[g] / 10 * load_g))`` seconds
of active time: ``w`` the planned (solo) iteration time, ``u`` the profile's ``gpu_util_pct`` /
100 (1 when unknown: a data-loading share of ``1 - u`` is not slowed), and ``load_g`` the
virtual GPU ``g``'s load: 1 plus, for every other data-parallel job with a share on ``g``, its
``u`` (time-slicing: each busy co-runner takes its turn). The iteration waits for its slowest
share, as synchronous data parallelism does. The load is recomputed every tick, so a ratio
change of a co-runner shows at once.

**The virtual GPUs' load** is what the emulated jobs of a node publish in one directory
(``$COSCHED_VIRTUAL_GPU_DIR``, given by the node agent on the ``virtual`` backend): each writes
``<job>-<attempt>.json`` (its ratio, ``u`` and pid) at start and at each ratio change, and
removes it when it ends; a file whose process is gone is ignored. The entry also holds the job's
current iteration factor, from which the ``virtual`` backend derives the GPUs' utilisation
(``VirtualBackend.shares_dir``). Jobs that do not use the SDK
do not appear there (they are not data-parallel in this model).

**Ratios.** At start the job asks the portal for its ratio (``TrainingClient.fetch``); without
Cosched it uses 10/10 on its first GPU (``COSCHED_GPU_INDICES``) of ``COSCHED_NODE_GPUS``. At
each epoch end it reports (its Slow-Down computed from its own planned solo time) and applies
the ratio of the reply from the next iteration on.

Report lines are those of ``workers.emulate`` (start, progress, epoch, done / term).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workers.report_lines import format_report
from workers.sdk import TrainingClient

VIRTUAL_GPU_DIR_ENV = "COSCHED_VIRTUAL_GPU_DIR"
NODE_GPUS_ENV = "COSCHED_NODE_GPUS"


def _emit(event: str, **fields: object) -> None:
    print(format_report(event, **fields), flush=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LoadBoard:
    """The node's published shares (see the module docstring)."""

    def __init__(self, directory: str | None, name: str, u: float) -> None:
        self.dir = Path(directory) if directory else None
        self.path = self.dir / f"{name}.json" if self.dir else None
        self.u = u

    def publish(self, ratio: tuple[int, ...], factor: float = 1.0, job: str = "") -> None:
        """Publish this job's shares and its current iteration factor (the virtual backend
        derives the GPUs' utilisation from them)."""
        if self.dir is None or self.path is None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        entry = {"ratio": list(ratio), "u": self.u, "pid": os.getpid(), "factor": factor}
        if job:
            entry["job"] = job
        tmp.write_text(json.dumps(entry))
        tmp.replace(self.path)

    def withdraw(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    def others(self) -> list[dict[str, Any]]:
        return read_board(self.dir, skip=self.path)


def read_board(directory: Path | None, skip: Path | None = None) -> list[dict[str, Any]]:
    """The live entries of a load board directory (files of ended processes are ignored)."""
    if directory is None or not directory.is_dir():
        return []
    out = []
    for p in directory.glob("*.json"):
        if p == skip:
            continue
        try:
            entry = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(entry, dict) and _alive(int(entry.get("pid") or 0)):
            out.append(entry)
    return out


def iteration_factor(ratio: tuple[int, ...], u: float, others: list[dict[str, Any]]) -> float:
    """How many solo iterations' time one iteration takes under ``ratio`` and the co-runners'
    published shares (see the module docstring)."""
    worst = 0.0
    for g, r in enumerate(ratio):
        if r <= 0:
            continue
        load = 1.0
        for entry in others:
            theirs = entry.get("ratio") or []
            if g < len(theirs) and theirs[g] > 0:
                load += float(entry.get("u", 1.0))
        worst = max(worst, r / 10.0 * load)
    return (1.0 - u) + u * worst


def _start_ratio(env: Mapping[str, str]) -> tuple[int, ...]:
    gpus = max(1, int(env.get(NODE_GPUS_ENV) or 1))
    first = (env.get("COSCHED_GPU_INDICES") or "0").split(",")[0]
    index = int(first) if first.isdigit() and int(first) < gpus else 0
    return tuple(10 if g == index else 0 for g in range(gpus))


def run_data_parallel(
    plan: Any, *, report_every: float, tick: float, env: Mapping[str, str]
) -> int:
    """Emulate ``plan`` (a ``workers.emulate.RunPlan``) data-parallel; returns the exit code."""
    stop: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        if not stop:
            stop.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    util = plan.profile.gpu_util_pct
    u = 1.0 if util is None else min(1.0, max(0.0, util / 100.0))
    iters, epochs = plan.iterations, plan.epochs
    w = plan.run_s / iters
    epoch_ends = {round(iters * (e + 1) / epochs) for e in range(epochs)}
    client = TrainingClient(iterations_total=iters, environ=env)
    ratio = _start_ratio(env)
    reply = client.fetch()
    if reply is not None and reply.data_ratio:
        ratio = reply.data_ratio
    client.data_ratio = ratio
    name = f"{env.get('COSCHED_JOB_ID', os.getpid())}-{env.get('COSCHED_ATTEMPT', '1')}"
    board = LoadBoard(env.get(VIRTUAL_GPU_DIR_ENV), name, u)
    job_id = env.get("COSCHED_JOB_ID", "")
    published = iteration_factor(ratio, u, board.others())
    board.publish(ratio, published, job_id)
    _emit(
        "start",
        profile=plan.profile.name.replace(" ", "_"),
        gpu_model=plan.gpu_model or "none",
        solo_s=plan.solo_s if plan.solo_s is not None else "none",
        scale=plan.scale,
        run_s=plan.run_s,
        iters=iters,
        epochs=epochs,
        steps=0,
        pid=os.getpid(),
        data_parallel=1,
    )
    wall0 = last = time.monotonic()
    active = 0.0
    done = 0
    partial = 0.0  # of the running iteration
    epoch = 0
    epoch_active0, epoch_iter0 = 0.0, 0
    last_report = -report_every

    last_mean = w  # the previous epoch's mean, until the new epoch has an iteration

    def mean_iter() -> float:
        n = done - epoch_iter0
        return (active - epoch_active0) / n if n > 0 else last_mean

    def progress() -> None:
        nonlocal last_report
        _emit(
            "progress",
            fraction=round((done + partial) / iters, 4),
            iter=done,
            iters=iters,
            iter_time_s=round(mean_iter(), 6),
            active_s=round(active, 3),
            elapsed_s=round(time.monotonic() - wall0, 3),
        )
        last_report = active

    try:
        progress()
        while done < iters:
            if stop:
                _emit("term", fraction=round(done / iters, 4), exit_code=128 + stop[0])
                return 128 + stop[0]
            factor = iteration_factor(ratio, u, board.others())
            if abs(factor - published) > 0.02 * published:
                published = factor
                board.publish(ratio, factor, job_id)
            time.sleep(tick)
            now = time.monotonic()
            dt = min(now - last, 2 * tick)  # stopped (SIGSTOP) time is not work
            last = now
            active += dt
            partial += dt / (w * factor)
            while partial >= 1.0 and done < iters:
                partial -= 1.0
                done += 1
                if done in epoch_ends:
                    epoch += 1
                    it = mean_iter()
                    _emit(
                        "epoch",
                        epoch=epoch,
                        epochs=epochs,
                        iter=done,
                        iters=iters,
                        iter_time_s=round(it, 6),
                        elapsed_s=round(now - wall0, 3),
                    )
                    sd = (active + (iters - done) * it) / plan.run_s
                    answer = client.report(done, epoch_end=True, epoch=epoch, slowdown=sd)
                    if answer is not None and answer.data_ratio and answer.data_ratio != ratio:
                        ratio = answer.data_ratio
                        published = iteration_factor(ratio, u, board.others())
                        board.publish(ratio, published, job_id)
                    epoch_active0, epoch_iter0, last_mean = active, done, it
            if active - last_report >= report_every:
                progress()
        partial = 0.0
        progress()
        _emit("done", iters=iters, active_s=round(active, 3), elapsed_s=round(last - wall0, 3))
        return 0
    finally:
        board.withdraw()
