"""Job isolation on a node: which unix account runs a job, its private files, its cgroup.

The node agent decides (``JobUsers``, ``Limits``), writes the decision into the attempt's
``spec.json`` (key ``isolation``, see ``JobLaunch``), and the job's runner (``workers.runner``,
still the agent's account) applies it when it starts the job:

- **Account** (``JobUsers``): ``owner`` mode runs each job as its portal owner's unix account:
  the account named in the map file (``portal_user unix_account`` per line), else the regular
  account (uid >= 1000) of the same name on the node, else the fallback account
  (``cosched-job`` by default; ``none``: no fallback, the launch fails). ``single`` mode runs
  every job as one account (an agent that is not root can only use its own). Switching
  accounts needs root (or ``CAP_SETUID``, ``CAP_SETGID``): an agent that is not root refuses
  ``owner`` mode (``JobUsers.check``).
- **Files**: the job's working directory (``<data>/work/job-<id>``) is owned by the account,
  mode 0700; its log (``<data>/logs/job-<id>.log``) is owned by the account, mode 0600, in a
  directory the jobs may traverse but not list or write (0711); the job's umask is 077. The
  agent's state directory (attempt specs with the job's environment, the lease, the wake FIFO)
  is 0700 and stays the agent's.
- **Privileges**: in the child, after ``fork`` and before ``exec``: join the job's cgroup, set the
  fallback resource limits, then ``setgroups`` (the account's supplementary groups),
  ``setresgid``, ``setresuid``. A process of another uid cannot read the agent's or the runner's
  ``/proc/<pid>/environ``, signal them, or signal another account's jobs.
- **Environment**: the agent filters it (``workers.launcher.build_env``: no database, broker,
  secret key or credential-looking variable); here ``HOME``, ``USER``, ``LOGNAME`` and ``SHELL``
  become the account's, and the agent's session variables (``XDG_*``, ``MAIL``, ``SUDO_*``,
  ``SSH_*``) go.
- **Limits** (``Limits``): a cgroup v2 directory per attempt under ``cgroup_root`` (default
  ``<cgroup2 mount>/cosched``) with ``cpu.max`` = the part's cores and ``memory.max`` = the
  job's memory (swap off: ``memory.swap.max`` 0), removed (``cgroup.kill`` first) when the job
  has ended. Where cgroup v2 with the ``cpu`` and ``memory`` controllers cannot be written (cgroup
  v1 hosts, containers without delegation, an agent that is not root), the agent says so once
  and falls back to ``RLIMIT_AS`` = the requested memory for CPU jobs (a GPU job's CUDA context
  reserves far more address space than memory, so GPU jobs get ``RLIMIT_DATA`` instead: their
  private writable memory) and no core limit.
- **GPU devices** (``GpuDevices``): each job process gets a private mount namespace in which
  the device node of every GPU it was not given (``/dev/nvidia<N>``) is covered by a bind mount
  of an empty root-owned file of mode 0000: opening it fails with EACCES for any account but
  root. The mounts are made in the child, after it joined its cgroup and before it drops its
  privileges (``unshare(CLONE_NEWNS)``, the whole mount tree made a slave so nothing
  propagates back to the node, then one bind mount per node); the namespace ends with the
  job's last process. It works the same on cgroup v1 and v2 hosts (no device cgroup). The
  control nodes every CUDA process needs (``nvidiactl``, ``nvidia-uvm``, ``nvidia-caps``) stay
  visible. Where the agent cannot make mount namespaces (not root, ``unshare`` refused) it says
  so once and the jobs see every GPU's node, as before.

Only standard modules the runner already loads (plus ``pwd``, ``grp``, ``resource``; ``ctypes``
only for a job whose GPU devices are hidden): the runner imports this module at every job start.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import pwd
import resource
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

OWNER = "owner"
FALLBACK_ACCOUNT = "cosched-job"
NO_FALLBACK = ("", "none")
# A portal user runs as the node account of the same name only if it is a regular account
# (uid at least this, login.defs' UID_MIN): a portal user called "postgres" or "daemon" must not
# get that system account. System accounts can still be named in the map file (never root).
MIN_OWNER_UID = 1000
CGROUP_PREFIX = "cosched"
CPU_PERIOD_US = 100_000
# The agent's login-session variables: not the job's business (and some name the agent's
# runtime directory). Removed from every job's environment when it runs as another account.
SESSION_PREFIXES = ("XDG_", "SUDO_", "SSH_", "DBUS_")
SESSION_NAMES = frozenset({"MAIL", "OLDPWD", "PWD", "KRB5CCNAME", "DISPLAY", "XAUTHORITY"})
CAP_SETGID, CAP_SETUID, CAP_SYS_ADMIN = 6, 7, 21
# unshare(2) and mount(2) flags (linux/sched.h, linux/mount.h).
CLONE_NEWNS = 0x00020000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SLAVE = 1 << 19
GPU_DEVICE_PREFIX = "nvidia"  # /dev/nvidia<minor>: one per GPU


class IsolationError(RuntimeError):
    """The job cannot be run as configured (an unknown account, an agent without the right to
    switch accounts, a bad map file)."""


class Account:
    """A unix account a job runs as."""

    __slots__ = ("name", "uid", "gid", "groups", "home", "shell")

    def __init__(
        self, name: str, uid: int, gid: int, groups: tuple[int, ...], home: str, shell: str
    ) -> None:
        self.name = name
        self.uid = uid
        self.gid = gid
        self.groups = groups
        self.home = home
        self.shell = shell

    @classmethod
    def lookup(cls, name: str) -> Account:
        """The account ``name`` (or a numeric uid) from the node's user database; raises
        IsolationError when it has none."""
        try:
            entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
        except (KeyError, ValueError, OverflowError):
            raise IsolationError(f"no unix account {name!r} on this node") from None
        groups = tuple(sorted({entry.pw_gid, *os.getgrouplist(entry.pw_name, entry.pw_gid)}))
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir, entry.pw_shell)

    @classmethod
    def current(cls) -> Account:
        """The account this process runs as."""
        uid = os.geteuid()
        try:
            return cls.lookup(str(uid))
        except IsolationError:
            # A uid without a passwd entry (some containers): itself, nothing to switch.
            return cls(str(uid), uid, os.getegid(), tuple(os.getgroups()), "/", "/bin/sh")

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "uid": self.uid,
            "gid": self.gid,
            "groups": list(self.groups),
            "home": self.home,
            "shell": self.shell,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Account:
        return cls(
            str(data["name"]),
            int(data["uid"]),
            int(data["gid"]),
            tuple(int(g) for g in data.get("groups", ())),
            str(data.get("home", "/")),
            str(data.get("shell", "/bin/sh")),
        )

    def __repr__(self) -> str:
        return f"Account({self.name!r}, uid={self.uid}, gid={self.gid})"


def has_capabilities(*bits: int) -> bool:
    """Does this process hold every capability ``bits`` (``linux/capability.h`` numbers) in its
    effective set?"""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    caps = int(line.split()[1], 16)
                    return all(caps & (1 << bit) for bit in bits)
    except (OSError, ValueError, IndexError):
        pass
    return False


def is_privileged() -> bool:
    """May this process switch to other accounts? (root, or CAP_SETUID and CAP_SETGID.)"""
    return os.geteuid() == 0 or has_capabilities(CAP_SETUID, CAP_SETGID)


def read_user_map(path: str) -> dict[str, str]:
    """``portal_user unix_account`` per line (``#`` comments, blank lines ignored); raises
    IsolationError naming the file and line of a bad one."""
    mapping: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise IsolationError(f"cannot read the user map {path}: {exc}") from None
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2:
            raise IsolationError(
                f"{path}:{number}: expected 'portal_user unix_account', got {raw.strip()!r}"
            )
        mapping[fields[0]] = fields[1]
    return mapping


class JobUsers:
    """Which unix account runs whose job (see the module docstring).

    ``JobUsers.single()`` (the default of ``NodeAgent``): every job as this process's own
    account: nothing switches, for the embedded demo and agents that are not root.
    """

    def __init__(
        self,
        mode: str,
        *,
        account: str | None = None,
        user_map: dict[str, str] | None = None,
        fallback: str | None = FALLBACK_ACCOUNT,
    ) -> None:
        if mode not in (OWNER, "single"):
            raise IsolationError(f"job user mode {mode!r}: 'owner' or 'single'")
        self.mode = mode
        self.account = account
        self.user_map = dict(user_map or {})
        self.fallback = None if fallback is None or fallback.lower() in NO_FALLBACK else fallback

    @classmethod
    def single(cls, account: str | None = None) -> JobUsers:
        """Every job as ``account`` (default: this process's own)."""
        return cls("single", account=account)

    @classmethod
    def from_options(
        cls, run_as: str | None, map_file: str | None = None, fallback: str | None = None
    ) -> JobUsers:
        """From the agent's ``--run-jobs-as`` (``owner`` or an account name; default: ``owner``
        when this process may switch accounts, else its own account), ``--job-user-map`` and
        ``--fallback-account`` (default ``cosched-job``; ``none``: none)."""
        if not run_as:
            run_as = OWNER if is_privileged() else Account.current().name
        fallback = FALLBACK_ACCOUNT if fallback is None else fallback
        if run_as == OWNER:
            mapping = read_user_map(map_file) if map_file else {}
            return cls(OWNER, user_map=mapping, fallback=fallback)
        if map_file:
            raise IsolationError(
                f"--job-user-map applies to --run-jobs-as owner, not to one account ({run_as})"
            )
        return cls.single(run_as)

    def check(self) -> list[str]:
        """Raise IsolationError when this process cannot run jobs as configured (says why and
        what to do); the warnings to print otherwise."""
        warnings: list[str] = []
        me = Account.current()
        if self.mode == OWNER:
            if not is_privileged():
                raise IsolationError(
                    f"running jobs as their owners (--run-jobs-as owner) needs root (or "
                    f"CAP_SETUID and CAP_SETGID), and this agent runs as {me.name} (uid "
                    f"{me.uid}); start it as root, or run every job as this one account with "
                    f"--run-jobs-as {me.name} (no isolation between users' jobs then)"
                )
            for portal_user, account in sorted(self.user_map.items()):
                try:
                    mapped = Account.lookup(account)
                except IsolationError as exc:
                    raise IsolationError(f"user map: {portal_user} -> {exc}") from None
                if mapped.uid == 0:
                    raise IsolationError(f"user map: {portal_user} -> root: jobs never run as root")
            if self.fallback is not None:
                try:
                    fallback = Account.lookup(self.fallback)
                except IsolationError:
                    raise IsolationError(
                        f"multi-user mode: the fallback account {self.fallback!r} does not "
                        f"exist on this node; create it (useradd --system --no-create-home "
                        f"--shell /usr/sbin/nologin {self.fallback}), or pass "
                        f"--fallback-account none (a job whose owner has no account here then "
                        f"fails to launch)"
                    ) from None
                if fallback.uid == 0:
                    raise IsolationError(f"the fallback account {self.fallback!r} is root")
            return warnings
        target = Account.lookup(self.account) if self.account else me
        if target.uid != me.uid and not is_privileged():
            raise IsolationError(
                f"--run-jobs-as {target.name}: this agent runs as {me.name} (uid {me.uid}) and "
                f"cannot switch to another account; run it as root or as {target.name}"
            )
        if target.uid == 0:
            warnings.append(
                "jobs run as root: any job can read the agent's files and environment and stop "
                "other jobs; use --run-jobs-as owner (or an unprivileged account) on a shared node"
            )
        return warnings

    def account_for(self, owner: str) -> Account:
        """The account job of portal user ``owner`` runs as; raises IsolationError (the launch
        fails with that reason) when there is none."""
        if self.mode != OWNER:
            return Account.lookup(self.account) if self.account else Account.current()
        name = self.user_map.get(owner)
        if name is not None:
            account = Account.lookup(name)
            if account.uid == 0:
                raise IsolationError(f"user map: {owner} -> root: jobs never run as root")
            return account
        if owner and not owner.isdigit():
            with contextlib.suppress(IsolationError):
                account = Account.lookup(owner)
                if account.uid >= MIN_OWNER_UID:
                    return account
        if self.fallback is None:
            raise IsolationError(
                f"portal user {owner!r} has no unix account on this node (none of that name, "
                f"none in the user map, and no fallback account)"
            )
        return Account.lookup(self.fallback)

    def level(self) -> str:
        """``ok`` when each job runs as its owner's account, else ``weak`` (every job runs as
        one account: jobs of different users can read each other's files and stop each other;
        as root, the agent's too)."""
        return "ok" if self.mode == OWNER else "weak"

    def describe(self) -> str:
        """The mode in words, for the agent's start-up line."""
        if self.mode == OWNER:
            extra = f", {len(self.user_map)} mapped" if self.user_map else ""
            fallback = f", else {self.fallback}" if self.fallback else ", no fallback"
            return f"jobs run as their owners' accounts{extra}{fallback}"
        account = self.account or Account.current().name
        return f"every job runs as {account}"


# --- resource limits ------------------------------------------------------------------------------


def cgroup2_mount(mounts: str = "/proc/self/mounts") -> str | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup``, or ``.../unified`` on a
    hybrid host), or None."""
    try:
        with open(mounts, encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and fields[2] == "cgroup2":
                    return fields[1]
    except OSError:
        pass
    return None


class Limits:
    """How a node limits its jobs' cores and memory: ``cgroup`` (v2, under ``root``) or
    ``rlimit`` (the fallback; ``reason`` says why)."""

    def __init__(self, kind: str, root: str | None = None, reason: str = "") -> None:
        self.kind = kind
        self.root = root
        self.reason = reason

    @classmethod
    def detect(cls, root: str | None = None) -> Limits:
        """cgroup v2 under ``root`` (default ``<cgroup2 mount>/cosched``) if this process can
        create job cgroups there with the ``cpu`` and ``memory`` controllers, else the
        fallback with the reason."""
        if root is None:
            mount = cgroup2_mount()
            if mount is None:
                return cls("rlimit", reason="no cgroup v2 hierarchy is mounted on this node")
            root = os.path.join(mount, CGROUP_PREFIX)
        parent = os.path.dirname(root.rstrip("/"))
        try:
            with open(os.path.join(parent, "cgroup.controllers"), encoding="ascii") as f:
                available = set(f.read().split())
        except OSError:
            return cls("rlimit", reason=f"{parent} is not a cgroup v2 directory")
        missing = {"cpu", "memory"} - available
        if missing:
            return cls(
                "rlimit",
                reason=f"the cgroup v2 hierarchy at {parent} has no "
                f"{' and '.join(sorted(missing))} controller (available: "
                f"{' '.join(sorted(available)) or 'none'}; on a hybrid host they belong to "
                f"cgroup v1)",
            )
        try:
            os.makedirs(root, exist_ok=True)
            _enable_controllers(parent)
            _enable_controllers(root)
        except OSError as exc:
            return cls(
                "rlimit",
                reason=f"cannot create job cgroups under {root} ({exc.strerror}); run the agent "
                f"as root or delegate that subtree to it",
            )
        return cls("cgroup", root=root)

    def level(self) -> str:
        """``ok`` with a cgroup per job, else ``weak`` (the rlimit fallback)."""
        return "ok" if self.kind == "cgroup" else "weak"

    def describe(self) -> str:
        if self.kind == "cgroup":
            return f"cores and memory limited by cgroup v2 under {self.root}"
        return (
            f"cores and memory NOT limited by cgroups: {self.reason}; fallback: an address-space "
            f"limit (RLIMIT_AS) of the requested memory for CPU jobs, a data limit (RLIMIT_DATA) "
            "for GPU jobs, no core limit"
        )

    def for_job(self, name: str, cpus: int, memory_mb: int | None, gpu: bool) -> dict:
        """The ``limits`` entry of ``JobLaunch`` for one attempt."""
        entry: dict = {"cpus": int(cpus), "memory_mb": memory_mb}
        if self.kind == "cgroup" and self.root:
            entry["cgroup"] = os.path.join(self.root, name)
        elif memory_mb and not gpu:
            entry["rlimit_as_mb"] = int(memory_mb)
        elif memory_mb:
            # A GPU job: its CUDA context reserves address space far beyond what it uses,
            # but not data (private writable memory: heap and anonymous maps).
            entry["rlimit_data_mb"] = int(memory_mb)
        return entry


def _enable_controllers(path: str) -> None:
    with open(os.path.join(path, "cgroup.subtree_control"), encoding="ascii") as f:
        enabled = set(f.read().split())
    wanted = [c for c in ("cpu", "memory") if c not in enabled]
    if wanted:
        with open(os.path.join(path, "cgroup.subtree_control"), "w", encoding="ascii") as f:
            f.write(" ".join(f"+{c}" for c in wanted))


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(value)


# --- GPU device nodes -----------------------------------------------------------------------------


def devices_to_hide(
    nodes: Mapping[int, str], process_gpus: Sequence[Sequence[int]]
) -> list[list[str]]:
    """The device nodes each process of a job must not open: those of every GPU in ``nodes``
    (GPU index -> device node path) but the ones the process holds (``process_gpus``: the GPU
    indices of each process, in start order). A per-GPU rank keeps its own GPU only, a process
    with several GPUs keeps them all, a CPU process (no GPU) keeps none."""
    ordered = sorted(nodes.items())
    return [[path for index, path in ordered if index not in gpus] for gpus in process_gpus]


class GpuDevices:
    """Whether a node hides from each job the GPUs it was not given (module docstring):
    ``namespace`` (a private mount namespace per job process) or ``none`` (``reason`` says
    why). ``nodes``: each GPU's device node (GPU index -> path)."""

    def __init__(self, kind: str, nodes: Mapping[int, str] | None = None, reason: str = "") -> None:
        self.kind = kind
        self.nodes = dict(nodes or {})
        self.reason = reason

    @property
    def constrained(self) -> bool:
        return self.kind == "namespace"

    @classmethod
    def detect(
        cls,
        nodes: Mapping[int, str],
        *,
        sys_admin: bool | None = None,
        no_nodes: str = "no GPU device nodes known on this node",
    ) -> GpuDevices:
        """Hide ``nodes`` (GPU index -> device node path) if this process can: it holds
        ``CAP_SYS_ADMIN`` (``sys_admin``; default: read from ``/proc/self/status``) and a
        child of it can make a private mount namespace and bind-mount a file there (tried
        once, on temporary files). ``no_nodes``: the reason when ``nodes`` is empty."""
        if not nodes:
            return cls("none", reason=no_nodes)
        if sys_admin is None:
            sys_admin = has_capabilities(CAP_SYS_ADMIN)
        if not sys_admin:
            me = Account.current()
            fix = "grant it that capability" if me.uid == 0 else "run it as root"
            return cls(
                "none",
                nodes,
                reason=f"the agent runs as {me.name} (uid {me.uid}) without CAP_SYS_ADMIN, "
                f"which a private mount namespace needs; {fix}",
            )
        failure = probe_hiding()
        if failure:
            return cls("none", nodes, reason=failure)
        return cls("namespace", nodes)

    def level(self) -> str:
        """``ok`` when hidden, ``n/a`` without device nodes (no GPUs, virtual GPUs), else
        ``weak``."""
        if self.constrained:
            return "ok"
        return "weak" if self.nodes else "n/a"

    def describe(self) -> str:
        """The node's GPU device isolation in words, for the agent's start-up line."""
        if self.constrained:
            return (
                "GPU devices: constrained (private mount namespace per job; a job running as "
                "root can undo it)"
            )
        if not self.nodes:
            return f"GPU devices: none to hide ({self.reason})"
        return f"GPU devices: not constrained ({self.reason})"

    def for_job(self, process_gpus: Sequence[Sequence[int]], mask: str) -> dict | None:
        """The ``gpu_devices`` entry of ``JobLaunch`` for one attempt (None: nothing hidden):
        ``mask`` (the empty file the runner makes and mounts over hidden nodes) and ``hide``
        (the nodes each process must not open, ``devices_to_hide``)."""
        if not self.constrained:
            return None
        return {"mask": mask, "hide": devices_to_hide(self.nodes, process_gpus)}


@functools.cache
def mount_calls() -> tuple[Callable[..., int], Callable[..., int], Callable[[], int]]:
    """The C library's ``unshare`` and ``mount``, and ctypes' ``get_errno`` for their errors
    (Python 3.11 has no ``os.unshare`` or ``os.mount``). Loaded once, before ``fork``: the child
    only calls them. Raises OSError."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)  # this process's own symbols, libc's among them
    unshare, mount = libc.unshare, libc.mount
    unshare.argtypes = [ctypes.c_int]
    mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
    return unshare, mount, ctypes.get_errno


def hide_paths(paths: Iterable[str], mask: str) -> None:
    """In this process: a private mount namespace (``unshare(CLONE_NEWNS)``, every mount made a
    slave, so what follows never propagates to the node) in which ``mask`` is bind-mounted over
    each of ``paths`` (a path that does not exist is skipped: nothing to open). Raises
    OSError."""
    unshare, mount, get_errno = mount_calls()

    def fail(what: str) -> OSError:
        code = get_errno()
        return OSError(code, f"{what}: {os.strerror(code)}")

    if unshare(CLONE_NEWNS) != 0:
        raise fail("unshare(CLONE_NEWNS)")
    if mount(b"none", b"/", None, MS_REC | MS_SLAVE, None) != 0:
        raise fail("mount --make-rslave /")
    source = os.fsencode(mask)
    for path in paths:
        if mount(source, os.fsencode(path), None, MS_BIND, None) != 0:
            error = fail(f"cannot hide {path}")
            if error.errno == errno.ENOENT and not os.path.lexists(path):
                continue
            raise error


def make_mask(path: str) -> None:
    """The empty file of mode 0000, owned by this process's account, that covers hidden device
    nodes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0)
    try:
        os.fchmod(fd, 0)
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def probe_hiding() -> str:
    """Can a child of this process hide a file as ``hide_paths`` does? "" if so, else why not
    (tried on two temporary files, in a forked child whose namespace ends with it)."""
    import shutil
    import tempfile

    try:
        mount_calls()
    except (OSError, AttributeError) as exc:
        return f"cannot load the C library's unshare and mount: {exc}"
    workdir = tempfile.mkdtemp(prefix="cosched-mount-probe-")
    try:
        mask, target = os.path.join(workdir, "mask"), os.path.join(workdir, "target")
        make_mask(mask)
        with open(target, "w", encoding="ascii") as f:
            f.write("x")
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: only system calls, then _exit
            code = 0
            try:
                os.close(read_fd)
                hide_paths([target], mask)
                if os.stat(target).st_size != 0:
                    raise OSError(0, "the bind mount did not take")
            except BaseException as exc:  # noqa: BLE001 (reported to the parent)
                with contextlib.suppress(OSError):
                    os.write(write_fd, str(exc).encode(errors="replace")[:400])
                code = 1
            os._exit(code)
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            message = pipe.read().decode(errors="replace")
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) == 0:
            return ""
        return f"cannot make a private mount namespace ({message or 'the probe failed'})"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# --- applied by the runner ------------------------------------------------------------------------


class JobLaunch:
    """What the runner applies when it starts one job: ``spec["isolation"]``, written by the
    agent: ``account`` (``Account.to_dict``; absent: no switch), ``limits``
    (``Limits.for_job``) and ``gpu_devices`` (``GpuDevices.for_job``; absent: nothing hidden).
    ``client`` (a Podman container job, docs/containers.md): the process started is the
    container runtime's client, which stays the runner's account with the runner's environment
    and umask (the runtime starts the image as ``account`` and limits it itself); the job's files
    are still made the account's."""

    def __init__(self, data: dict | None) -> None:
        data = data or {}
        account = data.get("account")
        self.account = Account.from_dict(account) if account else None
        self.limits = dict(data.get("limits") or {})
        self.cgroup: str | None = self.limits.get("cgroup")
        self.cgroup_error = ""
        devices = data.get("gpu_devices") or {}
        self.mask: str | None = devices.get("mask")
        self.hide: list[list[str]] = [[str(p) for p in paths] for paths in devices.get("hide", ())]
        self.client = bool(data.get("client"))

    def hidden_for(self, process: int) -> list[str]:
        """The device nodes process number ``process`` of the job (in start order) must not
        open; one list stands for every process. Raises IsolationError when the spec has none
        for it (the process must not start unconstrained)."""
        if not self.hide:
            return []
        if len(self.hide) == 1:
            return self.hide[0]
        if not 0 <= process < len(self.hide):
            raise IsolationError(f"no GPU devices to hide given for process {process}")
        return self.hide[process]

    @property
    def switches(self) -> bool:
        """Does the job run as another uid than the runner?"""
        return self.target is not None

    @property
    def target(self) -> Account | None:
        """The account to switch to, or None when the job runs as the runner's own uid."""
        if self.account is None or self.account.uid == os.geteuid():
            return None
        return self.account

    def prepare(self, log: str, cwd: str, private_dirs: Iterable[str] = ()) -> None:
        """The log (0600) and the working directory (0700) owned by the job's account, the
        directories above them traversable only; the job's cgroup. ``private_dirs`` (such as
        the checkpoint directory kept across attempts) are made 0700 and owned by the account
        too. Raises OSError."""
        for parent in {os.path.dirname(log), os.path.dirname(cwd.rstrip("/"))}:
            if parent:
                os.makedirs(parent, exist_ok=True)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)
            if (target := self.target) is not None:
                os.fchown(fd, target.uid, target.gid)
        finally:
            os.close(fd)
        for directory in dict.fromkeys([cwd, *private_dirs]):
            parent = os.path.dirname(directory.rstrip("/"))
            if parent:
                os.makedirs(parent, exist_ok=True)
            os.makedirs(directory, mode=0o700, exist_ok=True)
            if (target := self.target) is not None:
                os.chown(directory, target.uid, target.gid, follow_symlinks=False)
            os.chmod(directory, 0o700)
        if self.cgroup:
            self._make_cgroup()
        if any(self.hide):
            if not self.mask:
                raise IsolationError("GPU devices to hide, but no mask file")
            make_mask(self.mask)
            mount_calls()  # loaded here: the child only calls them

    def _make_cgroup(self) -> None:
        path = str(self.cgroup)
        try:
            os.makedirs(path, exist_ok=True)
            cpus = int(self.limits.get("cpus") or 0)
            memory_mb = self.limits.get("memory_mb")
            _write(
                os.path.join(path, "cpu.max"),
                f"{cpus * CPU_PERIOD_US} {CPU_PERIOD_US}" if cpus > 0 else f"max {CPU_PERIOD_US}",
            )
            _write(
                os.path.join(path, "memory.max"),
                str(int(memory_mb) * 2**20) if memory_mb else "max",
            )
            if memory_mb:
                with contextlib.suppress(OSError):  # absent without swap accounting
                    _write(os.path.join(path, "memory.swap.max"), "0")
        except OSError as exc:
            # The job still runs (as its owner), unlimited: said in its log.
            self.cgroup_error = f"cgroup {path}: {exc.strerror or exc}"
            self.cgroup = None

    def env(self, env: dict, cwd: str = "/") -> dict:
        """The job's environment: ``env`` with the account's identity when it switches
        (``HOME``: the account's, else the job's working directory ``cwd``)."""
        env = dict(env)
        target = self.target
        if target is None or self.client:
            return env
        for key in list(env):
            if key in SESSION_NAMES or key.startswith(SESSION_PREFIXES):
                del env[key]
        home = target.home if os.path.isdir(target.home) else cwd
        env.update(HOME=home, USER=target.name, LOGNAME=target.name, SHELL="/bin/sh")
        return env

    def preexec(self, process: int = 0) -> None:
        """In the job's process number ``process`` (start order), after ``fork``, before
        ``exec`` (``Popen(preexec_fn=...)``): join the cgroup, set the fallback limits, hide the
        GPU device nodes it was not given (``hidden_for``), drop to the account. Raises on
        failure (said in the job's log first: its stderr is the log already), so the job never
        runs with the runner's privileges or other jobs' GPUs."""
        try:
            self._preexec(process)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.write(2, f"[cosched] the job cannot start: {exc}\n".encode(errors="replace"))
            raise

    def drop_privileges(self) -> None:
        """In a helper of the job (the ``tee`` of its output), after ``fork``: only the switch
        (and the job's umask), so what it writes is the owner's, with the owner's rights."""
        os.umask(0o077)
        target = self.target
        if target is not None:
            os.setgroups(list(target.groups))
            os.setresgid(target.gid, target.gid, target.gid)
            os.setresuid(target.uid, target.uid, target.uid)
            if os.getresuid() != (target.uid,) * 3:
                raise OSError("the output copy did not drop its privileges")

    def _preexec(self, process: int) -> None:
        if self.client:
            return  # the container runtime applies the account and the limits
        if self.cgroup:
            _write(os.path.join(self.cgroup, "cgroup.procs"), "0")
        limit_mb = self.limits.get("rlimit_as_mb")
        if limit_mb:
            limit = int(limit_mb) * 2**20
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        data_mb = self.limits.get("rlimit_data_mb")
        if data_mb:
            limit = int(data_mb) * 2**20
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        os.umask(0o077)
        hidden = self.hidden_for(process)
        if hidden:
            if not self.mask:
                raise IsolationError("GPU devices to hide, but no mask file")
            hide_paths(hidden, self.mask)
        target = self.target
        if target is not None:
            os.setgroups(list(target.groups))
            os.setresgid(target.gid, target.gid, target.gid)
            os.setresuid(target.uid, target.uid, target.uid)
            if os.getresuid() != (target.uid,) * 3 or os.getresgid() != (target.gid,) * 3:
                raise OSError("the job did not drop its privileges")

    def cleanup(self) -> None:
        """Kill whatever is left in the job's cgroup (processes that left its process group)
        and remove it."""
        if not self.cgroup:
            return
        with contextlib.suppress(OSError):
            _write(os.path.join(self.cgroup, "cgroup.kill"), "1")
        for _ in range(40):
            try:
                os.rmdir(self.cgroup)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.05)


def node_isolation(
    users: JobUsers, limits: Limits | None, devices: GpuDevices | None
) -> tuple[dict[str, str], ...]:
    """How a node keeps its jobs apart, as ``NodeInfo.isolation`` reports it: one entry per
    aspect known (``limits`` and ``devices`` are None until the agent detected them)."""
    out = [{"what": "accounts", "level": users.level(), "text": users.describe()}]
    if limits is not None:
        out.append({"what": "limits", "level": limits.level(), "text": limits.describe()})
    if devices is not None:
        out.append({"what": "gpu_devices", "level": devices.level(), "text": devices.describe()})
    return tuple(out)
