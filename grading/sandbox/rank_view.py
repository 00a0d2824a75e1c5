"""What student code may see and touch, the rank's half: the worker enters the view ``isolation.plan`` made.

``enter`` (after ``sandbox.apply_limits``, before any student module is imported) moves the rank into namespaces
of its own and mounts its view (``grading.sandbox.isolation`` says what it is); ``watch`` notes for the staff each
attempt to reach past it (``isolation.attempts`` reads them).
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import sys
from pathlib import Path

from grading.sandbox.isolation import ACCESS_LOG, MAX_ATTEMPTS

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 1
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC = 428, 429, 1, 0o2000000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 1, 24, 38
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAP_VERSION_3 = 0x20080522


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def enter(spec: dict, rank: int, namespaces: dict[str, str]) -> dict:
    """Give this rank process the view ``spec`` (a ``plan``) allows; return ``{"applied", "skipped"}``.

    Call with one thread, before student code. The process joins the case's ``namespaces``
    (``sandbox.Namespaces.paths``: its user namespace where the grader is not root, its network and PID
    namespaces) and a mount namespace of its own, then forks once: this process becomes a small waiter that
    ends with the child's status, and the child, in the case's PID namespace, returns here as the rank.
    Without case namespaces it only switches user and drops its capabilities. Never raises otherwise: a step
    that fails is listed under "skipped", and the rank runs with what worked."""
    done: dict = {"applied": [], "skipped": []}
    if not spec.get("enabled", True):
        return {"applied": [], "skipped": []}
    if not sys.platform.startswith("linux"):
        return {"applied": [], "skipped": [f"namespaces, user and capabilities: Linux only, not {sys.platform}"]}
    libc = ctypes.CDLL(None, use_errno=True)
    rank_dir = Path(spec["case_dir"]) / f"rank{rank}"
    user = spec.get("user")
    try:
        joined = _enter_namespaces(libc, namespaces)
    except OSError as exc:
        done["skipped"].append(f"private namespaces: {exc}")
    else:
        _fork_into_namespace(libc)
        done["applied"] += joined
        _make_the_view(libc, spec, rank_dir, done)
    _drop_bounding_set(libc)
    if user:
        try:
            os.setgroups([])
            os.setresgid(user["gid"], user["gid"], user["gid"])
            os.setresuid(user["uid"], user["uid"], user["uid"])
            done["applied"].append(f"as user '{user['name']}'")
        except OSError as exc:
            done["skipped"].append(f"user '{user['name']}': {exc}")
    elif os.geteuid() == 0:
        done["applied"].append(f"as root ({spec.get('user_reason') or 'no user named'})")
    _drop_capabilities(libc, done)
    home = rank_dir / "home"
    with contextlib.suppress(OSError):
        home.mkdir(exist_ok=True)
    for name in ("HOME", "TMPDIR"):               # the rank's own folder: every other is read-only now
        os.environ[name] = str(home)
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):     # torch writes its caches there, not in /tmp
        os.environ[name] = str(home / name.lower())
    import tempfile
    tempfile.tempdir = None
    return done


def _make_the_view(libc, spec: dict, rank_dir: Path, done: dict) -> None:
    """In the rank's own mount namespace: the case's ``/proc`` and ``/dev/shm``, the hidden folders covered,
    every mount read-only but the rank's own folders; each step noted in ``done``."""
    try:                         # first: no mount of the rank's may reach the rest of the machine
        _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
    except OSError as exc:
        done["skipped"].append(f"a private file view: {exc}")
        return
    proc_flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    steps = [("a /proc of the case's processes only", lambda: _mount(libc, "proc", "/proc", "proc", proc_flags)),
             ("the case's own /dev/shm", lambda: _mount(libc, spec["shared"][-1], "/dev/shm", None, _MS_BIND)),
             ("the grader's files hidden", lambda: _hide(libc, spec["hide"])),
             ("other files read-only", lambda: _read_only_but(libc, [str(rank_dir), *spec["shared"]]))]
    for what, step in steps:
        try:
            step()
            done["applied"].append(what)
        except OSError as exc:
            done["skipped"].append(f"{what}: {exc}")


def watch(spec: dict, rank: int) -> None:
    """Note each attempt of this process to reach past its view: reading or listing a hidden path, changing a
    file of the grading copy or of the case outside its own folders, or opening another process's ``/proc``
    entry. One JSON line each (at most ``MAX_ATTEMPTS`` of each kind) in the rank's ``access.log``
    (``isolation.attempts`` reads them), through a ``sys.addaudithook`` hook, which code in the process cannot
    remove. A note for the staff, not a protection: ``enter`` protects."""
    if not spec.get("enabled", True):
        return
    rank_dir = Path(spec["case_dir"]) / f"rank{rank}"
    hidden = [(os.path.join(c["root"], ""), tuple(os.path.join(k, "") for k in c["keep"])) for c in spec["hide"]]
    guarded = tuple(os.path.join(p, "") for p in spec["guarded"])
    writable = tuple(os.path.join(p, "") for p in (str(rank_dir), *spec["shared"]))
    log = os.open(rank_dir / ACCESS_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    noted: dict[str, int] = {}
    proc_entry = re.compile(r"/proc/(\d+)(/|$)")
    write_events = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.truncate",
                    "os.chmod", "os.chown", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile"}

    def note(what: str, path: str) -> None:
        if noted.get(what, 0) < MAX_ATTEMPTS:
            noted[what] = noted.get(what, 0) + 1
            with contextlib.suppress(OSError):
                os.write(log, (json.dumps({"what": what, "path": path[:300]}) + "\n").encode())

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            writes = bool(isinstance(mode, str) and set(mode) & set("wax+")) or bool(
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC))
        elif event in ("os.listdir", "os.scandir"):
            path, writes = args[0], False
        elif event in write_events:
            path, writes = args[0], True
        else:
            return
        if not isinstance(path, (str, bytes, os.PathLike)):
            return
        try:
            real = os.path.join(os.path.realpath(os.fsdecode(path)), "")
        except (OSError, ValueError, TypeError):
            return
        found = proc_entry.match(real)
        if any(real.startswith(root) and not real.startswith(keep) for root, keep in hidden):
            note("write into" if writes else "read", real.rstrip("/"))
        elif writes and real.startswith(guarded) and not real.startswith(writable) and os.path.lexists(real):
            note("write into", real.rstrip("/"))    # an existing file: a library's new scratch file is no attempt
        elif found and int(found.group(1)) != os.getpid():
            note("open another process's", real.rstrip("/"))

    sys.addaudithook(hook)


def _enter_namespaces(libc, namespaces: dict[str, str]) -> list[str]:
    """Join the case's ``namespaces`` (the user namespace first, where there is one: it owns the others) and a
    new mount namespace of this process's own; return what was entered. OSError when it cannot, or when the
    case has none (``namespaces["refused"]`` says why: the machine refused them to the holder too)."""
    if not namespaces.get("pid"):
        raise OSError(f"the case has none ({namespaces.get('refused') or 'no reason given'})")
    entered = ["in the case's namespaces"]
    for kind, flag, what in (("user", _CLONE_NEWUSER, "of an unprivileged user namespace"),
                             ("net", _CLONE_NEWNET, "private network (loopback only)"), ("pid", _CLONE_NEWPID, "")):
        if namespaces.get(kind):
            fd = os.open(namespaces[kind], os.O_RDONLY)
            try:
                if libc.setns(fd, flag) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns({namespaces[kind]}): {os.strerror(errno)}")
            finally:
                os.close(fd)
            entered += [what] if what else []
    if libc.unshare(_CLONE_NEWNS) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare(mount): {os.strerror(errno)}")
    return entered


# The waiter a rank's first process becomes (``_fork_into_namespace``): a fresh small interpreter, so that it holds
# none of the fork server's memory; SIGUSR1 (the launcher's stack-dump request, for the rank) stays ignored.
_WAITER = r"""
import os, signal, sys
pid = int(sys.argv[1])
os.close(int(sys.argv[2]))          # started: the rank may change the file view now
while True:
    try:
        status = os.waitpid(pid, 0)[1]
        break
    except InterruptedError:
        continue
if os.WIFSIGNALED(status):
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
sys.exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)
"""


def _fork_into_namespace(libc) -> None:
    """Fork; the child returns, as the rank, once the waiter has started; this process becomes that waiter
    (``_WAITER``, through ``exec``), which ends with the child's status. The rank waits so that its mounts never
    pull a file from under the waiter's start."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    started, tell = os.pipe()
    pid = os.fork()
    if pid == 0:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)     # it ends with the waiter
        os.close(tell)
        while os.read(started, 1):                                # until the waiter closes its end
            pass
        os.close(started)
        return
    os.close(started)
    os.set_inheritable(tell, True)
    import faulthandler
    with contextlib.suppress(RuntimeError, ValueError):
        faulthandler.unregister(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)        # kept through exec
    os.execv(sys.executable, [sys.executable, "-I", "-S", "-c", _WAITER, str(pid), str(tell)])


def _mount(libc, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda text: text.encode() if text is not None else None  # noqa: E731
    if libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {target}: {os.strerror(errno)}")


def _set_read_only(libc, path: str, read_only: bool, recursive: bool) -> None:
    attr = _MountAttr(_MOUNT_ATTR_RDONLY if read_only else 0, 0 if read_only else _MOUNT_ATTR_RDONLY, 0, 0)
    if libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, path.encode(), _AT_RECURSIVE if recursive else 0,
                    ctypes.byref(attr), ctypes.sizeof(attr)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount_setattr {path}: {os.strerror(errno)}")


def _hide(libc, covers: list[dict]) -> None:
    """Put an empty folder over each folder of ``covers`` (``isolation.plan``'s ``hide``), with only its ``keep``
    paths attached again at their places, and an empty file (``/dev/null``) over each file; then move this
    process's working folder to the attached copy of itself (``..`` from the old one would climb the covered
    folder)."""
    for cover in covers:
        root = cover["root"]
        if not os.path.isdir(root):
            if os.path.exists(root):
                _mount(libc, "/dev/null", root, None, _MS_BIND)
            continue
        clones = [(path, _open_tree(libc, path)) for path in cover["keep"]]
        _mount(libc, "tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k,mode=755")
        for path, fd in clones:
            try:
                os.makedirs(path, mode=0o755, exist_ok=True)
                if libc.syscall(_SYS_MOVE_MOUNT, fd, b"", _AT_FDCWD, path.encode(), _MOVE_MOUNT_F_EMPTY_PATH) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"move_mount {path}: {os.strerror(errno)}")
            finally:
                os.close(fd)
    os.chdir(os.getcwd())


def _open_tree(libc, path: str) -> int:
    """A detached copy of the mounts at and under ``path`` (``open_tree(OPEN_TREE_CLONE)``), as a descriptor."""
    fd = libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, path.encode(), _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_RECURSIVE)
    if fd < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"open_tree {path}: {os.strerror(errno)}")
    return fd


def _read_only_but(libc, writable: list[str]) -> None:
    """Make every mount read-only but ``writable`` (each a mount of its own) and ``/dev/shm`` (the case's)."""
    for path in writable:
        _mount(libc, path, path, None, _MS_BIND)
    _set_read_only(libc, "/", True, recursive=True)
    for path in (*writable, "/dev/shm"):
        _set_read_only(libc, path, False, recursive=False)


def _drop_bounding_set(libc) -> None:
    """Empty the bounding and ambient sets (no program this process starts gains a capability); the effective
    ones stay until ``_drop_capabilities``."""
    try:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)


def _drop_capabilities(libc, done: dict) -> None:
    """Empty the bounding, ambient, effective, permitted and inheritable sets; set no_new_privs; note it."""
    _drop_bounding_set(libc)
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()          # two __user_cap_data_struct, all zero
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.capset(header, data) != 0:
        done["skipped"].append(f"dropping capabilities: {os.strerror(ctypes.get_errno())}")
    else:
        done["applied"].append("without capabilities")
