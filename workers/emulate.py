"""Job emulator: a real process that behaves like its application profile.

Demo and test jobs run this instead of real GPU code::

    python -m workers.emulate --profile NAME [--profile-file PATH] [--gpu-model M] [--scale X]
        [--duration S] [--iterations N] [--epochs E] [--fail-at FRACTION] [--exit-code N]
        [--steps-json JSON] [--report-every S] [--tick S] [--data-parallel]

**Profile** (no Django needed): the profile ``NAME`` is read from ``--profile-file PATH`` or, if
absent, from the environment variable ``COSCHED_PROFILE_JSON``, in the JSON form of
``workers.profiles`` (one profile, a list, or a name -> profile map). With neither source the
profile is just the name, and ``--duration`` must be given.

**Run time** (seconds of work, pauses excluded): the profile's solo time on the GPU model, times
``--scale`` (default 1; demos use e.g. 0.05). The GPU model is ``--gpu-model``, else
``$COSCHED_GPU_MODEL`` (set by ``workers.launcher.build_env``); a CPU placement
(``CUDA_VISIBLE_DEVICES=""``) without a GPU model uses the profile's ``cpu_time_s``. When the
profile has no time for that model, ``--duration S`` is used as is (not scaled); without it the
emulator exits 2.

**Behaviour**: the run is cut into ``--iterations`` (default 100) equal iterations in
``--epochs`` (default 1) epochs. Progress is work done in *active* time: the emulator sleeps in
ticks of ``--tick`` seconds and counts each tick's measured length, capped at two ticks, so time
spent stopped by SIGSTOP (or a cgroup freeze) is not counted and progress does not jump after
SIGCONT. Memory follows the profile's memory steps (``--steps-json`` replaces them: a JSON list of
``[start_fraction, from_mb, to_mb]`` or objects); nothing is allocated, the memory is reported.

**Output**: ``@cosched ...`` report lines on stdout (format and fields in
``workers.report_lines``): ``start``; ``progress`` every ``--report-every`` seconds of work
(default 1), at every memory-step change and at the end; ``epoch`` at each epoch end; then
``done``, ``fail`` or ``term``. Lines are flushed as written. A ``progress`` line's
``iter_time_s`` is the mean active time per iteration over the iterations completed in the
current epoch (ALGORITHMS.md §5), reaching back over the last ``MIN_WINDOW_ITERS`` completed
iterations while the epoch has fewer, and the planned iteration time before the first one ends:
a mean over one report period, with one or two iterations in it, made the live Slow-Down jump.
The emulator wakes at each iteration's end, so the completion times it measures are exact to
the sleep's accuracy, not to a tick.

**Checkpoints** (docs/preemption.md): with ``$COSCHED_CHECKPOINT_DIR`` set (the node agent sets
it: one directory per job, kept across its attempts), the emulator writes its progress to
``emulate.json`` there every ``--checkpoint-every`` seconds of work (default 5; 0: only on a
signal) and on SIGTERM / SIGINT, before it exits; a later attempt of the same job (same profile)
resumes from the fraction saved there instead of from 0 (``start`` says ``resumed_from``, and a
``checkpoint`` line reports each save). The fraction, not the seconds, is saved: the next attempt
may run on another GPU model. ``--no-resume`` ignores a saved checkpoint.

**Data-parallel** (``--data-parallel``): the job splits its batches over the node's virtual GPUs
by its data ratio, reports epoch ends through the training SDK and follows the ratio the
portal answers; its speed follows the virtual GPUs' load (``workers.emulate_dp``).

**Exit codes**: 0 when done; ``--exit-code`` (default 1) once progress reaches ``--fail-at``;
143 on SIGTERM and 130 on SIGINT (after a ``term`` line); 2 on a usage or profile error.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import FrameType

from scheduler.catalog import UnknownGpuModel, canonical_model
from scheduler.domain import Profile
from workers.profiles import (
    load_profile,
    memory_at,
    step_index_at,
    steps_from_json,
)
from workers.report_lines import format_report

GPU_MODEL_ENV = "COSCHED_GPU_MODEL"
CHECKPOINT_DIR_ENV = "COSCHED_CHECKPOINT_DIR"
ATTEMPT_ENV = "COSCHED_ATTEMPT"
CHECKPOINT_FILE = "emulate.json"
# A progress line's iteration time is a mean over at least this many completed iterations once
# the run has them (see the module docstring).
MIN_WINDOW_ITERS = 5


class EmulatorError(Exception):
    """A usage or profile problem; the emulator prints it and exits 2."""


@dataclass(frozen=True)
class RunPlan:
    """What one emulated run does. ``run_s`` is seconds of active work."""

    profile: Profile
    gpu_model: str | None
    solo_s: float | None
    scale: float
    run_s: float
    iterations: int
    epochs: int
    fail_at: float | None
    exit_code: int
    checkpoint_dir: str | None = None
    fail_as: str = "error"  # or "gpu-oom": the failure prints PyTorch's CUDA OOM message
    resume_fraction: float = 0.0  # of the work, saved by an earlier attempt
    attempt: str = ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m workers.emulate",
        description="Run for a profile-derived time, walking the profile's memory steps.",
    )
    parser.add_argument("--profile", required=True, help="profile name")
    parser.add_argument("--profile-file", help="JSON profile document (else $COSCHED_PROFILE_JSON)")
    parser.add_argument("--gpu-model", help="catalogue GPU model (else $COSCHED_GPU_MODEL)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the profile time")
    parser.add_argument("--duration", type=float, help="seconds, when the profile has no time")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--fail-at", type=float, help="fail at this fraction (0..1) of the run")
    parser.add_argument("--exit-code", type=int, default=1, help="exit code of --fail-at")
    parser.add_argument(
        "--fail-as",
        choices=["error", "gpu-oom"],
        default="error",
        help="how --fail-at fails: a plain error, or out of GPU memory (PyTorch's CUDA OOM "
        "message, which the portal recognises on a shared GPU: docs/sharing.md)",
    )
    parser.add_argument("--steps-json", help="memory steps replacing the profile's (JSON list)")
    parser.add_argument("--report-every", type=float, default=1.0, help="seconds of work")
    parser.add_argument("--tick", type=float, default=0.05, help="sleep granularity, seconds")
    parser.add_argument(
        "--checkpoint-every",
        type=float,
        default=5.0,
        help="seconds of work between checkpoints in $COSCHED_CHECKPOINT_DIR (0: on signals only)",
    )
    parser.add_argument(
        "--no-resume", action="store_true", help="start from 0 even if a checkpoint exists"
    )
    parser.add_argument(
        "--data-parallel",
        action="store_true",
        help="split batches over the node's virtual GPUs by a data ratio, via the training SDK "
        "(workers.emulate_dp)",
    )
    return parser


def read_checkpoint(directory: str | None, profile: str) -> float:
    """The fraction of the work an earlier attempt saved in ``directory`` for ``profile``
    (0.0 when there is none, it is unreadable or it is another profile's)."""
    if not directory:
        return 0.0
    try:
        with open(os.path.join(directory, CHECKPOINT_FILE), encoding="utf-8") as f:
            data = json.load(f)
        fraction = float(data["fraction"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0
    if data.get("profile") != profile or not 0.0 <= fraction <= 1.0:
        return 0.0
    return fraction


def write_checkpoint(directory: str, profile: str, fraction: float, attempt: str) -> None:
    """Save ``fraction`` atomically (a reader sees the old checkpoint or the new one) and on
    disk (the node may die right after)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, CHECKPOINT_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    data = {"profile": profile, "fraction": fraction, "attempt": attempt, "at": time.time()}
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def plan_run(args: argparse.Namespace, env: Mapping[str, str]) -> RunPlan:
    """Resolve the profile, GPU model and run time from the arguments and environment."""
    if args.scale <= 0 or args.iterations < 1 or args.epochs < 1 or args.tick <= 0:
        raise EmulatorError("--scale, --iterations, --epochs and --tick must be positive")
    if args.checkpoint_every < 0:
        raise EmulatorError("--checkpoint-every must be >= 0")
    if args.epochs > args.iterations:
        raise EmulatorError("--epochs may not exceed --iterations")
    if args.fail_at is not None and not 0.0 <= args.fail_at <= 1.0:
        raise EmulatorError("--fail-at is a fraction in 0..1")
    try:
        profile = load_profile(args.profile, path=args.profile_file, env=env)
        if profile is None:
            profile = Profile(name=args.profile)
        if args.steps_json:
            profile = replace(profile, memory_steps=steps_from_json(json.loads(args.steps_json)))
    except (OSError, ValueError) as exc:  # ProfileFormatError and JSON errors are ValueErrors
        raise EmulatorError(str(exc)) from exc

    raw_model = args.gpu_model or env.get(GPU_MODEL_ENV) or None
    gpu_model: str | None = None
    if raw_model:
        try:
            gpu_model = canonical_model(raw_model)
        except UnknownGpuModel:
            gpu_model = raw_model  # a model the catalogue lacks may still be in the profile
    if gpu_model is None and env.get("CUDA_VISIBLE_DEVICES") == "":
        solo = profile.cpu_time_s
    elif gpu_model is not None:
        solo = profile.gpu_time_s.get(gpu_model)
    else:
        solo = None

    if solo is not None:
        run_s = solo * args.scale
    elif args.duration is not None:
        run_s = args.duration
    else:
        where = f"GPU model {gpu_model}" if gpu_model else "this placement (no GPU model given)"
        raise EmulatorError(
            f"profile {profile.name!r} has no solo time for {where}; pass --duration SECONDS"
        )
    if run_s <= 0:
        raise EmulatorError(f"run time must be positive, got {run_s}")
    checkpoint_dir = env.get(CHECKPOINT_DIR_ENV) or None
    resume = 0.0 if args.no_resume else read_checkpoint(checkpoint_dir, profile.name)
    return RunPlan(
        profile=profile,
        gpu_model=gpu_model,
        solo_s=solo,
        scale=args.scale,
        run_s=run_s,
        iterations=args.iterations,
        epochs=args.epochs,
        fail_at=args.fail_at,
        exit_code=args.exit_code,
        fail_as=args.fail_as,
        checkpoint_dir=checkpoint_dir,
        resume_fraction=resume,
        attempt=env.get(ATTEMPT_ENV, ""),
    )


class _Signals:
    """Remembers the first SIGTERM/SIGINT so the main loop can stop between ticks."""

    def __init__(self) -> None:
        self.received: int | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum


def _emit(event: str, **fields: object) -> None:
    print(format_report(event, **fields), flush=True)


def run(plan: RunPlan, *, report_every: float, tick: float, checkpoint_every: float = 0.0) -> int:
    """Emulate the run; returns the exit code. Prints report lines on stdout."""
    stop = _Signals()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    profile = plan.profile
    iters = plan.iterations
    iter_s = plan.run_s / iters
    epoch_iters = [round(iters * (e + 1) / plan.epochs) for e in range(plan.epochs)]
    _emit(
        "start",
        profile=profile.name.replace(" ", "_"),
        gpu_model=plan.gpu_model or "none",
        solo_s=plan.solo_s if plan.solo_s is not None else "none",
        scale=plan.scale,
        run_s=plan.run_s,
        iters=iters,
        epochs=plan.epochs,
        steps=len(profile.memory_steps),
        pid=os.getpid(),
        resumed_from=round(plan.resume_fraction, 6),
    )

    wall_start = time.monotonic()
    last = wall_start
    # A resumed run starts where the checkpoint left it (the work of earlier attempts is done).
    active = plan.resume_fraction * plan.run_s
    first_iter = min(iters, int(active / iter_s + 1e-9))
    last_report = active  # active seconds at the previous progress line
    last_checkpoint = active
    epoch = sum(1 for end in epoch_iters if end <= first_iter)  # reported by earlier attempts
    epoch_start = (first_iter * iter_s, first_iter)
    step = step_index_at(profile, plan.resume_fraction)
    # (iterations done, active seconds when that count was first seen), the latest last; spans
    # at least MIN_WINDOW_ITERS iterations once full.
    completions: deque[tuple[float, int]] = deque([epoch_start], maxlen=MIN_WINDOW_ITERS + 1)

    def checkpoint(fraction: float) -> None:
        nonlocal last_checkpoint
        last_checkpoint = active
        if plan.checkpoint_dir is None:
            return
        try:
            write_checkpoint(plan.checkpoint_dir, profile.name, fraction, plan.attempt)
        except OSError as exc:
            print(f"workers.emulate: checkpoint not written: {exc}", file=sys.stderr, flush=True)
            return
        _emit("checkpoint", fraction=round(fraction, 6), attempt=plan.attempt or "none")

    def mean_iter_time() -> float:
        """Mean active seconds per completed iteration: over the current epoch, or over the
        last MIN_WINDOW_ITERS completions while the epoch has fewer; the plan before any."""
        end_active, end_iter = completions[-1]
        start_active, start_iter = epoch_start
        if end_iter - start_iter < MIN_WINDOW_ITERS:
            start_active, start_iter = min(completions[0], epoch_start, key=lambda c: c[1])
        if end_iter <= start_iter:
            return iter_s
        return (end_active - start_active) / (end_iter - start_iter)

    def progress_line(fraction: float, done: int) -> None:
        nonlocal last_report
        _emit(
            "progress",
            fraction=round(fraction, 4),
            iter=done,
            iters=iters,
            iter_time_s=round(mean_iter_time(), 6),
            step=step_index_at(profile, fraction),
            mem_mb=round(memory_at(profile, fraction), 1),
            active_s=round(active, 3),
            elapsed_s=round(time.monotonic() - wall_start, 3),
        )
        last_report = active

    progress_line(plan.resume_fraction, first_iter)
    while True:
        if stop.received is not None:
            fraction = min(1.0, active / plan.run_s)
            checkpoint(fraction)
            name = signal.Signals(stop.received).name
            code = 128 + stop.received
            _emit("term", fraction=round(fraction, 4), signal=name, exit_code=code)
            return code

        fraction = min(1.0, active / plan.run_s)
        done = min(iters, int(active / iter_s + 1e-9))
        if done > completions[-1][1]:
            completions.append((active, done))

        while epoch < plan.epochs and done >= epoch_iters[epoch]:
            n = epoch_iters[epoch] - epoch_start[1]
            _emit(
                "epoch",
                epoch=epoch + 1,
                epochs=plan.epochs,
                iter=epoch_iters[epoch],
                iters=iters,
                iter_time_s=round((active - epoch_start[0]) / n if n else iter_s, 6),
                elapsed_s=round(time.monotonic() - wall_start, 3),
            )
            epoch_start = (active, epoch_iters[epoch])
            epoch += 1

        if plan.fail_at is not None and fraction >= plan.fail_at:
            progress_line(fraction, done)
            _emit("fail", fraction=round(fraction, 4), exit_code=plan.exit_code)
            if plan.fail_as == "gpu-oom":
                print(
                    f"torch.OutOfMemoryError: CUDA out of memory (emulated: {profile.name} at "
                    f"{fraction:.0%})",
                    file=sys.stderr,
                    flush=True,
                )
                return plan.exit_code
            print(
                f"emulated failure of {profile.name} at {fraction:.0%} "
                f"(exit code {plan.exit_code})",
                file=sys.stderr,
                flush=True,
            )
            return plan.exit_code

        new_step = step_index_at(profile, fraction)
        if fraction >= 1.0:
            progress_line(1.0, iters)
            _emit(
                "done",
                iters=iters,
                active_s=round(active, 3),
                elapsed_s=round(time.monotonic() - wall_start, 3),
            )
            return 0
        if new_step != step or active - last_report >= report_every:
            step = new_step
            progress_line(fraction, done)
        if checkpoint_every > 0 and active - last_checkpoint >= checkpoint_every:
            checkpoint(fraction)

        # wake at the end of the running iteration, so its measured completion time is exact
        to_next_iter = (done + 1) * iter_s - active if done < iters else tick
        time.sleep(max(0.0, min(tick, plan.run_s - active, to_next_iter)))
        now = time.monotonic()
        # A tick longer than two ticks means we were stopped (SIGSTOP, freezer): not work.
        active += min(now - last, 2 * tick)
        last = now


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        plan = plan_run(args, os.environ if env is None else env)
    except EmulatorError as exc:
        print(f"workers.emulate: {exc}", file=sys.stderr)
        return 2
    if args.data_parallel:
        from workers.emulate_dp import run_data_parallel

        return run_data_parallel(
            plan,
            report_every=args.report_every,
            tick=args.tick,
            env=os.environ if env is None else env,
        )
    return run(
        plan,
        report_every=args.report_every,
        tick=args.tick,
        checkpoint_every=args.checkpoint_every,
    )


if __name__ == "__main__":
    sys.exit(main())
