"""The job runner: one small process per attempt, the job's parent (like Slurm's slurmstepd).

    python -S -m workers.runner ATTEMPT_DIR

The node agent starts it in its own session, so a ``kill -9`` or a ``SIGSTOP`` of the agent
leaves it alone. It starts the job (a shell command in a session of its own, so pause / resume /
kill reach the job's children too), waits for it, and writes how it ended to ``result.json``.
It enforces the job's **time limit** (``time_limit_s``: running time of this attempt; time the
job spends stopped by a pause is not counted): past it, SIGTERM, then SIGKILL after the grace,
and the result's outcome is ``time_limit``. It enforces the node's **lease**: when the lease
file says the lease has run out without renewal (the agent could not reach the portal, or is
frozen, or dead), it stops the job itself (SIGTERM, then SIGKILL after the lease's grace), so
the portal may start the job again elsewhere once the lease plus a margin has passed and two
attempts never run at once.

Once the job has ended it wakes the agent (a byte into the agent's FIFO) and stays until the
agent has the result acknowledged (the attempt directory goes). If the agent has not done so
``report_after_s`` after the end (it is frozen, dead or cut off), the runner sends the result to
the portal itself (``workers.protocol.ResultReport`` with the node's token), so a job that
finished while its agent was away is not started again when the lease runs out.

Files (JSON, each written atomically: a temporary file renamed into place):

- ``ATTEMPT_DIR/spec.json`` (agent, before the start): ``argv``, ``env``, ``ranks``
  (optional: one mapping per process to start, added to ``env``: a data-parallel job's ranks,
  one per GPU; absent: one process), ``cwd``, ``log``,
  ``lease_file``, ``lease_deadline`` (``lease_clock`` s; used while the lease file is missing),
  ``wake_fifo``, ``report`` (``url``, ``token_file``, ``node``, ``job_id``, ``attempt``; absent
  in-process), ``report_after_s``, ``ack_wait_s`` (how long to stay for the acknowledgement),
  ``time_limit_s`` and ``time_limit_grace_s`` (optional: the job's time limit, counted in
  running time, and the SIGTERM-to-SIGKILL grace when it is reached), ``checkpoint_dir``
  (optional: created with the working directory; kept across the job's attempts).
  ``container`` (optional, a Podman container job: ``runtime``, ``name``, ``env``: the
  container's name and the environment of ``podman`` commands; the container is stopped with
  ``podman stop`` and removed with ``podman rm`` when the job ends, whatever ended it).
- ``ATTEMPT_DIR/gpu-mask`` (runner, before the start, when the job's ``isolation`` hides GPU
  devices): the empty mode-0000 file mounted over them (``workers.isolation``).
- ``ATTEMPT_DIR/runner.json`` (runner, at once): ``pid``, ``start_ticks`` (its start time in
  clock ticks since boot: a reused pid is not mistaken for it).
- ``ATTEMPT_DIR/job.json`` (runner, once the job started): ``pid``, ``pgid``, ``start_ticks``,
  ``started_at`` (epoch s) of the first process, ``pgids`` (every process's group).

With several ranks, each is started in a session of its own and all are one job: the job has
ended when every rank has exited, or as soon as one exits with a failure (the others are then
stopped: SIGTERM, SIGKILL after the grace), and its status is the first failure's.
- ``ATTEMPT_DIR/stop.json`` (agent, then SIGTERM to the runner): ``outcome`` (``killed`` or
  ``stopped``), ``detail``, ``grace_s``.
- ``ATTEMPT_DIR/reported.json`` (runner): it reported the result to the portal itself.
- ``ATTEMPT_DIR/result.json`` (runner, when the job ended, flushed to disk): ``outcome``
  (``workers.protocol.OUTCOMES``), ``exit_code`` (the job's status as ``subprocess`` gives it:
  negative = killed by that signal), ``detail``, ``started_at``, ``ended_at``.
- the node's lease file (agent, shared by its runners): ``deadline`` (``lease_clock()``
  seconds: CLOCK_BOOTTIME, shared by every process of this boot and counting time the machine
  spent suspended, so a resumed node knows its lease ran out), ``kill_grace_s``.

Only a few standard modules are imported (no ``typing``, no ``pathlib``) and the agent starts
it without ``site``: a runner costs a few milliseconds of CPU just when its job starts.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

from workers import isolation

# coreutils' tee: the copy of a job's output to its owner's files (run as the owner).
TEE = "/usr/bin/tee" if os.path.exists("/usr/bin/tee") else "/bin/tee"

SPEC = "spec.json"
RUNNER = "runner.json"
JOB = "job.json"
STOP = "stop.json"
RESULT = "result.json"
REPORTED = "reported.json"
GPU_MASK = "gpu-mask"
CHECK_EVERY_S = 0.25  # how often the lease file is looked at
DEFAULT_GRACE_S = 10.0


def lease_clock() -> float:
    """Seconds on the clock leases are measured with: CLOCK_BOOTTIME (Linux), which unlike
    CLOCK_MONOTONIC goes on while the machine is suspended; CLOCK_MONOTONIC elsewhere."""
    return time.clock_gettime(_LEASE_CLOCK)


_LEASE_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def write_json(path: str | os.PathLike[str], data: dict, *, sync: bool = False) -> None:
    """Write ``data`` to ``path`` atomically (readers see the old file or the new, never half);
    ``sync``: and on disk before returning (a result must survive a power cut; the other files
    need not: a crash of the machine ends its processes anyway)."""
    path = os.fspath(path)
    head, tail = os.path.split(path)
    tmp = os.path.join(head, f".{tail}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str | os.PathLike[str]) -> dict | None:
    """The object in ``path``, or None when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _stat_fields(pid: int | str) -> list[str] | None:
    """/proc/<pid>/stat after the command name (field 3, the state, first), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat field 22), or
    None when there is no such process. With the pid it identifies a process for good."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def is_alive(pid: int | None, ticks: int | None) -> bool:
    """Is process ``pid`` the one that started at ``ticks``, and not a zombie?"""
    if not pid or ticks is None:
        return False
    fields = _stat_fields(pid)
    return bool(fields) and fields[19] == str(ticks) and fields[0] not in ("Z", "X")


def group_alive(pgid: int) -> bool:
    """Does any live (non-zombie) process remain in process group ``pgid``?"""
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(name)
            if fields and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
                return True
    return False


PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): a
    descendant whose parent dies is re-parented to it, not to init, so the job's processes
    stay in its tree even when they leave the job's session (``setsid``, a double fork).
    False where the call is not available."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> dict[int, str]:
    """Every process below ``root`` (pid -> state letter): through each process's
    ``/proc/<pid>/task/<tid>/children`` (a few reads for a job's tree), else by reading every
    process's parent in /proc."""
    out: dict[int, str] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        kids = _task_children(pid)
        if kids is None:
            if pid == root:
                return _descendants_by_scan(root)
            continue  # it went meanwhile
        for kid in kids:
            if kid not in out:
                fields = _stat_fields(kid)
                if fields:
                    out[kid] = fields[0]
                    todo.append(kid)
    return out


def _task_children(pid: int) -> list[int] | None:
    """The children of every thread of ``pid``, or None without /proc/<pid>/task/*/children."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    kids: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                kids.extend(int(c) for c in f.read().split())
        except FileNotFoundError:
            if tid == str(pid):
                return None  # no children files on this kernel (or the process went)
        except (OSError, ValueError):
            continue
    return kids


def _descendants_by_scan(root: int) -> dict[int, str]:
    parent: dict[int, int] = {}
    state: dict[int, str] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(name)
        if not fields:
            continue
        try:
            parent[int(name)] = int(fields[1])
        except (IndexError, ValueError):
            continue
        state[int(name)] = fields[0]
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, str] = {}
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out[pid] = state[pid]
        todo.extend(children.get(pid, ()))
    return out


def _children(pid: int) -> list[int] | None:
    """The direct children of ``pid`` (``/proc/<pid>/task/<pid>/children``), or None."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return None


def lease_deadline(lease_file: str, fallback: float) -> tuple[float, float]:
    """(deadline in ``lease_clock`` s, kill grace in s) from the lease file, else ``fallback``."""
    data = read_json(lease_file)
    if data is None:
        return fallback, DEFAULT_GRACE_S
    try:
        return float(data["deadline"]), float(data.get("kill_grace_s", DEFAULT_GRACE_S))
    except (KeyError, TypeError, ValueError):
        return fallback, DEFAULT_GRACE_S


class Runner:
    """One attempt's runner; ``run`` returns when ``result.json`` is written."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        spec = read_json(self._path(SPEC))
        if spec is None:
            raise SystemExit(f"runner: no readable {self._path(SPEC)}")
        self.spec = spec
        self.lease_file = str(spec["lease_file"])
        self.fallback_deadline = float(spec.get("lease_deadline", 0.0))
        self._lease_mtime: int | None = None
        self._lease = (self.fallback_deadline, DEFAULT_GRACE_S)
        self._stop_asked = False
        self.proc: subprocess.Popen[bytes] | None = None  # the first (or only) process
        self.procs: list[subprocess.Popen[bytes]] = []
        # ``tee`` copies of the output to the owner's files, and the write ends of
        # their pipes (closed in the runner once the job has them).
        self.tees: list[subprocess.Popen[bytes]] = []
        self._pipes: list[int] = []
        self.started_at: float | None = None
        self.result: dict | None = None
        self.isolation = isolation.JobLaunch(None)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)

    def _path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    # -- signals ---------------------------------------------------------------------------------

    def _on_term(self, signum: int, frame: object) -> None:
        self._stop_asked = True

    def _install_signals(self) -> None:
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the agent's terminal going away

    # -- lease -----------------------------------------------------------------------------------

    def lease(self) -> tuple[float, float]:
        try:
            mtime = os.stat(self.lease_file).st_mtime_ns
        except OSError:
            return self._lease
        if mtime != self._lease_mtime:
            self._lease_mtime = mtime
            self._lease = lease_deadline(self.lease_file, self.fallback_deadline)
        return self._lease

    def lease_expired(self) -> bool:
        return lease_clock() >= self.lease()[0]

    def _stop_request(self) -> dict | None:
        if self._stop_asked or os.path.exists(self._path(STOP)):
            return read_json(self._path(STOP)) or {}
        return None

    # -- the job ---------------------------------------------------------------------------------

    def _finish(self, outcome: str, exit_code: int | None, detail: str) -> None:
        self.result = {
            "outcome": outcome,
            "exit_code": exit_code,
            "detail": detail,
            "started_at": self.started_at,
            "ended_at": time.time(),
        }
        write_json(self._path(RESULT), self.result, sync=True)
        self._wake_agent()

    def _wake_agent(self) -> None:
        """A byte into the agent's FIFO, so it collects the result now (nobody there: fine)."""
        fifo = self.spec.get("wake_fifo")
        if not fifo:
            return
        with contextlib.suppress(OSError):
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            try:
                os.write(fd, b"r")
            finally:
                os.close(fd)

    def linger(self) -> None:
        """Stay until the agent has the result acknowledged (the directory goes); report it to
        the portal directly if the agent has not after ``report_after_s``."""
        report = self.spec.get("report")
        report_at = time.monotonic() + float(self.spec.get("report_after_s", 5.0))
        give_up = time.monotonic() + float(self.spec.get("ack_wait_s", 24 * 3600))
        retry_in = 1.0
        while os.path.exists(self._path(SPEC)) and time.monotonic() < give_up:
            if report and time.monotonic() >= report_at:
                if self._report(report):
                    write_json(self._path(REPORTED), {"at": time.time()})
                    return
                report_at = time.monotonic() + retry_in
                retry_in = min(30.0, retry_in * 2)
            time.sleep(0.25)

    def _report(self, target: dict) -> bool:
        """POST the result as a ``ResultReport``; True when the portal acknowledged it."""
        import http.client
        import urllib.parse

        result = dict(self.result or {})
        result.update(job_id=target["job_id"], attempt=target["attempt"])
        body = json.dumps(
            {"version": target.get("version", 1), "node": target["node"], "results": [result]}
        ).encode()
        try:
            with open(target["token_file"], encoding="utf-8") as f:
                token = f.read().strip()
            url = urllib.parse.urlsplit(target["url"])
            cls = (
                http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
            )
            conn = cls(url.hostname, url.port, timeout=10)
            try:
                conn.request(
                    "POST",
                    url.path.rstrip("/") + target["path"],
                    body=body,
                    headers={
                        "Authorization": f"Bearer {token}",
                        "Content-Type": "application/json",
                    },
                )
                response = conn.getresponse()
                answer = json.loads(response.read() or b"{}")
            finally:
                conn.close()
        except (OSError, ValueError, KeyError, http.client.HTTPException):
            return False
        acked = answer.get("acked") if isinstance(answer, dict) else None
        return response.status == 200 and bool(acked)

    def job_dirs(self) -> list[str]:
        """The job's own directories, created before it starts: its working directory and its
        checkpoint directory (``COSCHED_CHECKPOINT_DIR``, kept across attempts)."""
        return [str(d) for d in (self.spec["cwd"], self.spec.get("checkpoint_dir")) if d]

    def _start(self) -> bool:
        spec = self.spec
        log = str(spec["log"])
        ranks = spec.get("ranks") or [{}]
        # Isolation (workers.isolation): the job's account, its private log and working
        # directory, its cgroup, the GPU device nodes each process may not open; applied in
        # the child before exec.
        self.isolation = iso = isolation.JobLaunch(spec.get("isolation"))
        try:
            iso.prepare(log, str(spec["cwd"]), private_dirs=self.job_dirs())
            with open(log, "ab") as out:
                if iso.cgroup_error:
                    out.write(f"[cosched] no cgroup limits: {iso.cgroup_error}\n".encode())
                    out.flush()
                stdout, stderr = self._output_streams(out, iso)
                for number, extra in enumerate(ranks):
                    self.procs.append(
                        subprocess.Popen(
                            spec["argv"],
                            env=iso.env({**spec["env"], **extra}, str(spec["cwd"])),
                            cwd=spec["cwd"],
                            stdin=subprocess.DEVNULL,
                            stdout=stdout,
                            stderr=stderr,
                            start_new_session=True,
                            close_fds=True,
                            # The runner has one thread: fork-safe.
                            preexec_fn=functools.partial(iso.preexec, number),
                        )
                    )
            self._close_pipes()
        except (OSError, subprocess.SubprocessError, isolation.IsolationError) as exc:
            self._close_pipes()
            for proc in self.procs:  # ranks already started go with the one that could not
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            self._finish("launch_failed", None, f"cannot start the command: {exc}")
            return False
        self.proc = self.procs[0]
        self.started_at = time.time()
        write_json(
            self._path(JOB),
            {
                "pid": self.proc.pid,
                "pgid": self.proc.pid,
                "pgids": [p.pid for p in self.procs],
                "start_ticks": start_ticks(self.proc.pid),
                "started_at": self.started_at,
            },
        )
        return True

    def _output_streams(self, log: object, iso: object) -> tuple[object, object]:
        """The job's stdout and stderr: the log itself, or pipes into ``tee -a`` processes run
        as the job's owner (dropped like the job, umask 077: a new file is 0600), which copy to
        the log and to the owner's output and error files (``output`` / ``error`` in the spec:
        paths, relative to ``cwd``). What the owner may not write is not written: ``tee`` says
        so in the log and goes on copying to it."""
        output, error = self.spec.get("output"), self.spec.get("error")
        if not output and not error:
            return log, subprocess.STDOUT

        def tee(path: str) -> int:
            read_end, write_end = os.pipe()
            self._pipes.append(write_end)
            try:
                self.tees.append(
                    subprocess.Popen(
                        [TEE, "-a", "--", str(path)],
                        cwd=self.spec["cwd"],
                        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
                        stdin=read_end,
                        stdout=log,
                        stderr=log,
                        start_new_session=True,
                        close_fds=True,
                        preexec_fn=iso.drop_privileges,  # type: ignore[attr-defined]
                    )
                )
            finally:
                os.close(read_end)
            return write_end

        stdout = tee(output) if output else log
        stderr = tee(error) if error and error != output else subprocess.STDOUT
        return stdout, stderr

    def _close_pipes(self) -> None:
        for fd in self._pipes:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._pipes = []

    def _wait_tees(self, timeout: float = 5.0) -> None:
        """The copies end when every process of the job closed its output; a process that
        left the job and keeps it open does not hold the result back longer than ``timeout``."""
        deadline = time.monotonic() + timeout
        for tee in self.tees:
            try:
                tee.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    tee.kill()
                tee.wait()

    def _job_stopped(self) -> bool:
        """Is the job's main process stopped (paused by SIGSTOP)? Paused time is not running
        time for the time limit."""
        assert self.proc is not None
        fields = _stat_fields(self.proc.pid)
        return bool(fields) and fields[0] in ("T", "t")

    def _signal_group(self, signum: int) -> None:
        """``signum`` to the job's process groups and to every other process below the runner
        (those that left the groups: ``setsid``, adopted orphans)."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signum)
        spared = self._spared()
        for pid, state in descendants(os.getpid()).items():
            if state not in ("Z", "X") and pid not in spared:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signum)

    def _spared(self) -> set[int]:
        """The runner's own helpers below it (the owner's output copies, ``tee``): they end
        when the job's output closes, after the last of it is written."""
        return {tee.pid for tee in getattr(self, "tees", ()) if tee.poll() is None}

    def _reap_adopted(self) -> None:
        """Collect the exit status of orphans re-parented to the runner (it is their
        subreaper), so none stays a zombie; the job's own processes are left to ``procs``."""
        ours = {p.pid for p in self.procs} | {t.pid for t in getattr(self, "tees", ())}
        me = os.getpid()
        children = _children(me)
        if children is None:  # no /proc/<pid>/task/<tid>/children: the slower walk
            children = [p for p, st in descendants(me).items() if st == "Z"]
        for pid in children:
            if pid not in ours:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)

    def _sweep(self, timeout: float = 10.0) -> int:
        """End of the attempt: SIGKILL every process still below the runner, escaped sessions
        included, until none is left (or ``timeout``: one stuck in the kernel). Returns how
        many processes it killed."""
        me = os.getpid()
        killed: set[int] = set()
        deadline = time.monotonic() + timeout
        for proc in self.procs:  # once: a group emptied since may see its id reused
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        while True:
            spared = self._spared()
            alive = {
                p for p, st in descendants(me).items() if st not in ("Z", "X") and p not in spared
            }
            for pid in alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            killed |= alive - {p.pid for p in self.procs}
            self._reap_adopted()
            if not alive or time.monotonic() >= deadline:
                return len(killed)
            time.sleep(0.01)

    def _status(self) -> int | None:
        """The job's status once it has ended: every rank exited (the first failure's status,
        else 0), or one failed (its status; the others still run). None while it runs."""
        codes = [p.poll() for p in self.procs]
        failed = [c for c in codes if c is not None and c != 0]
        if failed:
            return failed[0]
        if all(c is not None for c in codes):
            return 0
        return None

    def _wait(self, timeout: float, pidfds: list[int]) -> int | None:
        """Wait up to ``timeout`` s for the job to end or a signal; the status or None."""
        assert self.proc is not None
        fds = [self._wake_r] + [
            fd for fd, p in zip(pidfds, self.procs, strict=False) if p.returncode is None
        ]
        if len(pidfds) < len(self.procs):
            timeout = min(timeout, 0.05)
        try:
            ready, _, _ = select.select(fds, [], [], max(0.0, timeout))
        except InterruptedError:
            ready = []
        if self._wake_r in ready:
            with contextlib.suppress(OSError):
                os.read(self._wake_r, 512)
        return self._status()

    def _podman(self, action: str, grace_s: float | None = None) -> None:
        """``podman stop|rm`` of a Podman container job's container (no-op for other jobs)."""
        container = self.spec.get("container") or {}
        if container.get("runtime") != "podman" or not container.get("name"):
            return
        from workers.containers import podman_control_argv

        argv = podman_control_argv(action, str(container["name"]), grace_s=grace_s)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                argv,
                env=dict(container.get("env") or {}),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=(grace_s or 0) + 60,
            )

    def _stop(self, grace_s: float, pidfds: list[int]) -> int:
        """SIGTERM (and SIGCONT, so a stopped job sees it) to the job's groups, SIGKILL after
        ``grace_s``; returns the job's status. A container is stopped by its runtime first
        (SIGTERM to the job, SIGKILL after the grace)."""
        if self.spec.get("container"):
            self._signal_group(signal.SIGCONT)  # a paused job's client, so it sees the end
            self._podman("unpause")
            self._podman("stop", grace_s)
            grace_s = min(grace_s, 5.0)  # the client ends with its container
        self._signal_group(signal.SIGTERM)
        self._signal_group(signal.SIGCONT)
        deadline = time.monotonic() + grace_s
        while (code := self._wait(deadline - time.monotonic(), pidfds)) is None or any(
            p.poll() is None for p in self.procs
        ):
            if time.monotonic() >= deadline:
                self._signal_group(signal.SIGKILL)
                for proc in self.procs:
                    proc.wait()
                status = self._status()
                return status if status is not None else -signal.SIGKILL
        return code

    def _end_ranks(self, pidfds: list[int]) -> int:
        """A rank failed: stop the ones still running (a data-parallel job cannot go on
        without it); the job's status stays the failure's."""
        code = self._status()
        assert code is not None
        if any(p.poll() is None for p in self.procs):
            self._stop(float(self.spec.get("time_limit_grace_s", DEFAULT_GRACE_S)), pidfds)
        return code

    def run(self) -> int:
        me = os.getpid()
        become_subreaper()
        write_json(self._path(RUNNER), {"pid": me, "start_ticks": start_ticks(me)})
        self._install_signals()
        if self.lease_expired():
            self._finish("lease_expired", None, "the node's lease had run out before the start")
            return 0
        stop = self._stop_request()
        if stop is not None:
            self._finish(str(stop.get("outcome", "killed")), None, "stopped before it started")
            return 0
        if not self._start():
            return 0
        assert self.proc is not None
        pidfd: list[int] = []
        with contextlib.suppress(AttributeError, OSError):
            for proc in self.procs:
                pidfd.append(os.pidfd_open(proc.pid))
        outcome, detail = "exited", ""
        limit = self.spec.get("time_limit_s")
        limit = float(limit) if limit else None
        running_s, last = 0.0, time.monotonic()
        while True:
            code = self._wait(CHECK_EVERY_S, pidfd)
            self._reap_adopted()
            if code is not None:
                if code != 0 and len(self.procs) > 1:
                    failed = next(i for i, p in enumerate(self.procs) if p.poll() == code)
                    code = self._end_ranks(pidfd)
                    detail = f"rank {failed} of {len(self.procs)} on this node"
                break
            now = time.monotonic()
            if not self._job_stopped():
                running_s += now - last
            last = now
            if limit is not None and running_s >= limit:
                outcome = "time_limit"
                detail = f"time limit {format_seconds(limit)} reached: the runner stopped the job"
                grace = float(self.spec.get("time_limit_grace_s", DEFAULT_GRACE_S))
                code = self._stop(grace, pidfd)
                break
            stop = self._stop_request()
            if stop is not None:
                outcome = str(stop.get("outcome", "killed"))
                detail = str(stop.get("detail", "stopped by the node agent"))
                code = self._stop(float(stop.get("grace_s", DEFAULT_GRACE_S)), pidfd)
                break
            if self.lease_expired():
                outcome = "lease_expired"
                detail = "the node's lease ran out without renewal: the runner stopped the job"
                code = self._stop(self.lease()[1], pidfd)
                break
        # No process outlives its attempt: the job's groups and whatever left them (``setsid``,
        # orphans re-parented to the runner, its subreaper) get SIGKILL; a container whose client
        # was killed is removed all the same; the owner's output copies (tee) then read the
        # last of the output and end; anything still left below the runner goes in the sweep,
        # and, with a cgroup, anything else in it. ``ended_at`` is taken after.
        self._signal_group(signal.SIGKILL)
        self._podman("rm")
        self._wait_tees()
        escaped = self._sweep()
        self.isolation.cleanup()
        if escaped:
            with contextlib.suppress(OSError), open(str(self.spec["log"]), "ab") as out:
                out.write(
                    f"[cosched] {escaped} process(es) left when the job ended: killed\n".encode()
                )
        if outcome == "exited":
            detail = f"{describe_status(code)} ({detail})" if detail else describe_status(code)
        else:
            detail = f"{detail} ({describe_status(code)})"
        self._finish(outcome, code, detail)
        return 0


def format_seconds(seconds: float) -> str:
    """``HH:MM:SS`` (``D-HH:MM:SS`` from a day on), as ``scheduler.durations`` writes limits."""
    total = max(0, int(round(seconds)))
    days, rest = divmod(total, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


def describe_status(code: int | None) -> str:
    """An exit status as ``subprocess`` reports it, in words ("exit code 3", "killed by
    SIGKILL", "exit code 137 (SIGKILL)")."""
    if code is None:
        return "no exit status"
    if code < 0:
        return f"killed by {_signal_name(-code)}"
    if 128 < code <= 128 + 64:
        return f"exit code {code} ({_signal_name(code - 128)})"
    return f"exit code {code}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -S -m workers.runner ATTEMPT_DIR", file=sys.stderr)
        return 2
    runner = Runner(args[0])
    code = runner.run()
    runner.linger()
    return code


if __name__ == "__main__":
    sys.exit(main())
