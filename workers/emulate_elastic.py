"""Emulated elastic data-parallel training job (issue 17, ALGORITHMS.md §6), one process per
rank::

    python -m workers.emulate_elastic --curve 1:10,2:20,3:29,4:30 --steps 2000
        [--warmup-s S] [--slow-gpu NODE/INDEX --slow-factor F --slow-after-s S]

Each process is one rank of a synchronous data-parallel group, as the node agents start them for
an elastic job (one process per GPU; ``docs/elastic.md``). It reads the group from the launcher
environment: ``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR`` / ``MASTER_PORT``, its own GPU in
``COSCHED_GPU`` (``node/index``), ``COSCHED_CHECKPOINT_DIR``. Without them it is a group of one.

- **Rendezvous**: rank 0 listens on ``MASTER_ADDR:MASTER_PORT`` and waits for the other
  ``WORLD_SIZE - 1`` ranks to connect and say who they are (``--rendezvous-timeout-s``). So the
  group only trains when the agents really started every rank with the right environment.
- **Training**: the group's throughput at w ranks is the ``--curve`` value (steps per second
  of the whole job; linear between the counts given) times its slowest rank's speed, which rank
  0 asks every rank for at each step of 10 mini-batches (an all-gather). A rank runs at
  ``--slow-factor`` from ``--slow-after-s`` seconds of training on when it sits on
  ``--slow-gpu`` (a slow device made on purpose: a rank moved to another GPU is healthy).
- **Statistics and safe points**: after every 10 mini-batches rank 0 saves a checkpoint (steps
  done, training time) and reports the window through the training SDK (``workers.sdk``,
  ``TrainingClient.report_window(..., checkpointed=True)``). When the answer says
  ``regroup``, the portal has ended this attempt: rank 0 stops training and waits to be
  stopped; the next attempt's ranks resume from the checkpoint, after ``--warmup-s`` of
  bootstrap (every regroup restarts every rank, as torchrun does).

Output (rank 0): ``@cosched`` report lines (``workers.report_lines``): ``start``, ``progress``
after each window (with the group size and the slowest rank's speed), ``elastic`` when the
portal regroups the job, ``done``. Exit 0 when the steps are done (every rank), 2 on a usage
error, 3 when the rendezvous or the group fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

from workers.report_lines import format_report

WINDOW_BATCHES = 10
CHECKPOINT = "elastic-emulator.json"


class WindowClient(Protocol):
    def report_window(
        self,
        workers: int,
        batches: int,
        seconds: float,
        rank_rates: Sequence[float] = (),
        remaining_steps: float = 0.0,
        checkpointed: bool = False,
    ) -> Mapping[str, Any] | None: ...


def parse_curve(text: str) -> dict[int, float]:
    """``"1:10,2:20,4:35"`` -> ``{1: 10.0, 2: 20.0, 4: 35.0}`` (positive throughputs)."""
    curve: dict[int, float] = {}
    for item in text.split(","):
        count, sep, value = item.strip().partition(":")
        if not sep:
            raise ValueError(f"curve item {item!r} is not workers:throughput")
        w, r = int(count), float(value)
        if w < 1 or not r > 0:
            raise ValueError(f"curve item {item!r}: workers >= 1 and throughput > 0")
        curve[w] = r
    if not curve:
        raise ValueError("the curve is empty")
    return curve


def throughput(curve: Mapping[int, float], workers: int) -> float:
    """The curve at ``workers``: linear between the counts given, flat beyond the ends."""
    known = sorted(curve)
    if workers <= known[0]:
        return curve[known[0]]
    if workers >= known[-1]:
        return curve[known[-1]]
    lo = max(k for k in known if k <= workers)
    hi = min(k for k in known if k >= workers)
    if lo == hi:
        return curve[lo]
    return curve[lo] + (curve[hi] - curve[lo]) * (workers - lo) / (hi - lo)


@dataclass(frozen=True)
class Group:
    """This process's place in its group, from the launcher environment."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    gpu: str  # node/index, "" when not given
    checkpoint_dir: Path
    attempt: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Group:
        return cls(
            rank=int(env.get("RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", "0")),
            gpu=env.get("COSCHED_GPU", ""),
            checkpoint_dir=Path(env.get("COSCHED_CHECKPOINT_DIR") or "."),
            attempt=int(env.get("COSCHED_ATTEMPT", "1")),
        )


@dataclass(frozen=True)
class Slowness:
    """A slow device made on purpose: ranks on ``gpu`` run at ``factor`` after ``after_s``."""

    gpu: str = ""
    factor: float = 1.0
    after_s: float = 0.0

    def speed(self, gpu: str, elapsed_s: float) -> float:
        if self.gpu and gpu == self.gpu and elapsed_s >= self.after_s:
            return self.factor
        return 1.0


def load_checkpoint(directory: Path) -> tuple[int, float]:
    """(steps done, training seconds) saved by an earlier attempt, else (0, 0)."""
    try:
        data = json.loads((directory / CHECKPOINT).read_text())
        return int(data["done"]), float(data["elapsed_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0, 0.0


def save_checkpoint(directory: Path, done: int, elapsed_s: float) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{CHECKPOINT}.{os.getpid()}"
    tmp.write_text(json.dumps({"done": done, "elapsed_s": elapsed_s}))
    os.replace(tmp, directory / CHECKPOINT)


class Peers:
    """Rank 0's connections to the other ranks (the emulated collective)."""

    def __init__(self, files: dict[int, tuple[TextIO, str]]) -> None:
        self.files = files  # rank -> (socket file, its GPU)

    @classmethod
    def gather(cls, group: Group, timeout_s: float) -> Peers:
        """Accept every other rank of the group (raise ``TimeoutError`` when one is missing)."""
        if group.world_size <= 1:
            return cls({})
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", group.master_port))
        server.listen(group.world_size)
        deadline = time.monotonic() + timeout_s
        files: dict[int, tuple[TextIO, str]] = {}
        try:
            while len(files) < group.world_size - 1:
                server.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    conn, _ = server.accept()
                except TimeoutError as exc:
                    missing = sorted(set(range(1, group.world_size)) - set(files))
                    raise TimeoutError(f"ranks {missing} did not join in {timeout_s:g} s") from exc
                conn.settimeout(timeout_s)
                f = conn.makefile("rw", encoding="utf-8", newline="\n")
                hello = f.readline().split()
                if len(hello) >= 2 and hello[0] == "hello":
                    files[int(hello[1])] = (f, hello[2] if len(hello) > 2 else "")
        finally:
            server.close()
        return cls(files)

    def speeds(self, elapsed_s: float) -> dict[int, float]:
        out = {}
        for _, (f, _gpu) in sorted(self.files.items()):
            f.write(f"step {elapsed_s!r}\n")
            f.flush()
        for rank, (f, _) in sorted(self.files.items()):
            line = f.readline()
            if not line:
                raise ConnectionError(f"rank {rank} left the group")
            out[rank] = float(line)
        return out

    def finish(self) -> None:
        for f, _ in self.files.values():
            with contextlib.suppress(OSError):
                f.write("done\n")
                f.flush()


def follower(group: Group, slow: Slowness, timeout_s: float) -> int:
    """A rank other than 0: join rank 0, answer its speed at every step until it is done."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = socket.create_connection((group.master_addr, group.master_port), timeout=2)
            break
        except OSError:
            if time.monotonic() >= deadline:
                print(f"rank {group.rank}: rank 0 at {group.master_addr}:{group.master_port}"
                      f" did not answer in {timeout_s:g} s", file=sys.stderr)  # fmt: skip
                return 3
            time.sleep(0.1)
    conn.settimeout(None)
    f = conn.makefile("rw", encoding="utf-8", newline="\n")
    f.write(f"hello {group.rank} {group.gpu}\n")
    f.flush()
    for line in f:
        word, _, arg = line.strip().partition(" ")
        if word == "done":
            return 0
        if word == "step":
            f.write(f"{slow.speed(group.gpu, float(arg))!r}\n")
            f.flush()
    print(f"rank {group.rank}: rank 0 left the group", file=sys.stderr)
    return 3


def leader(
    group: Group,
    curve: Mapping[int, float],
    total_steps: int,
    slow: Slowness,
    client: WindowClient | None,
    *,
    warmup_s: float,
    timeout_s: float,
    sleep: Callable[[float], None] = time.sleep,
    emit: Callable[[str], None] = print,
) -> int:
    """Rank 0: gather the group, resume from the checkpoint, train window by window."""
    try:
        peers = Peers.gather(group, timeout_s)
    except (TimeoutError, OSError) as exc:
        print(f"rank 0: rendezvous failed: {exc}", file=sys.stderr)
        return 3
    w = group.world_size
    done, elapsed = load_checkpoint(group.checkpoint_dir)
    gpus = [group.gpu] + [gpu for _, (_, gpu) in sorted(peers.files.items())]
    emit(format_report("start", steps=total_steps, workers=w, resumed=done, attempt=group.attempt))
    emit(format_report("elastic", change=f"group_of_{w}", workers=w, gpus=",".join(gpus)))
    sleep(warmup_s)  # every rank of a new group bootstraps (paper 002: most of a recovery)
    while done < total_steps:
        batches = min(WINDOW_BATCHES, total_steps - done)
        try:
            others = peers.speeds(elapsed)
        except (OSError, ValueError) as exc:
            print(f"rank 0: {exc}", file=sys.stderr)
            return 3
        speeds = [slow.speed(group.gpu, elapsed)] + [others[r] for r in sorted(others)]
        seconds = batches / (throughput(curve, w) * min(speeds))
        sleep(seconds)
        done += batches
        elapsed += seconds
        save_checkpoint(group.checkpoint_dir, done, elapsed)
        reply = None
        if client is not None and done < total_steps:
            reply = client.report_window(
                w, batches, seconds, speeds, float(total_steps - done), checkpointed=True
            )
        emit(
            format_report(
                "progress",
                fraction=done / total_steps,
                iter=done,
                iters=total_steps,
                workers=w,
                slowest=min(speeds),
                elapsed_s=elapsed,
            )
        )
        if reply and reply.get("regroup"):
            target = reply.get("workers")
            emit(format_report("elastic", change=f"regroup_to_{target}", workers=target))
            return wait_to_be_stopped(sleep)
    peers.finish()
    emit(format_report("done", iters=total_steps, workers=w))
    return 0


def wait_to_be_stopped(sleep: Callable[[float], None], limit_s: float = 300.0) -> int:
    """The portal regrouped the job: its agents stop this attempt (SIGTERM). Not stopped within
    ``limit_s``: something is wrong; exit 3 rather than hold the GPUs."""
    waited = 0.0
    while waited < limit_s:
        sleep(0.5)
        waited += 0.5
    print("rank 0: regrouped but not stopped", file=sys.stderr)
    return 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m workers.emulate_elastic", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--curve", required=True, help="workers:steps_per_s,... e.g. 1:10,2:20")
    parser.add_argument("--steps", type=int, required=True, help="mini-batches of the whole run")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="bootstrap of each group")
    parser.add_argument("--slow-gpu", default="", help="NODE/INDEX: a slow device on purpose")
    parser.add_argument("--slow-factor", type=float, default=0.4)
    parser.add_argument("--slow-after-s", type=float, default=0.0)
    parser.add_argument("--rendezvous-timeout-s", type=float, default=60.0)
    return parser


def main(
    argv: Sequence[str] | None = None,
    client: WindowClient | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    args = build_parser().parse_args(argv)
    try:
        curve = parse_curve(args.curve)
        group = Group.from_env(os.environ if env is None else env)
    except ValueError as exc:
        print(f"emulate_elastic: {exc}", file=sys.stderr)
        return 2
    if args.steps < 1 or not 0 < args.slow_factor <= 1 or not 0 <= group.rank < group.world_size:
        print(
            "emulate_elastic: --steps >= 1, 0 < --slow-factor <= 1, 0 <= RANK < WORLD_SIZE",
            file=sys.stderr,
        )
        return 2
    slow = Slowness(args.slow_gpu, args.slow_factor, args.slow_after_s)
    if group.rank > 0:
        return follower(group, slow, args.rendezvous_timeout_s)
    if client is None:
        client = _sdk_client()
    return leader(
        group,
        curve,
        args.steps,
        slow,
        client,
        warmup_s=args.warmup_s,
        timeout_s=args.rendezvous_timeout_s,
        emit=lambda line: print(line, flush=True),
    )


def _sdk_client() -> WindowClient | None:
    """The training SDK's client from the environment (None when the job has no token)."""
    from workers.sdk import TrainingClient

    client = TrainingClient()
    return client if client.enabled else None


if __name__ == "__main__":
    sys.exit(main())
