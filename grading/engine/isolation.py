"""What student code may see and touch: each rank gets a view of the machine without the grader's keys.

Parent side, ``plan`` says what a case's ranks may not read (the grader's own tree: the course secret, every
``staff.py``, the hidden checks; a ``batch``'s other submissions), what each may write (its own record folder, the
case's hand-off and store folders) and which user they run as; ``rank_environment`` is all of the parent's
environment a rank gets. Child side, ``enter`` (the worker calls it after ``sandbox.apply_limits``, before any
student module is imported) makes that view, and ``watch`` notes for the staff report each attempt to reach past
it; the parent reads those with ``attempts``.

A rank sees, after ``enter``:

* its own processes only (a PID namespace with its own ``/proc``): no other process's environment, command line
  or memory, and no process outside to signal;
* the grader's tree and the hidden paths as empty, read-only folders (a mount namespace);
* every other file read-only, but for its own folders and a private ``/dev/shm``;
* as root: the unprivileged user ``plan`` names (``student``, made by the Gradescope bundle's ``setup.sh``) where
  the interpreter is usable by it, and no capability either way.

Without root the namespaces come from a user namespace of the grader's own user (Linux's unprivileged user
namespaces). ``summary`` says in one line what a run got; ``docs/sandbox.md`` has the table per place.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pwd
import re
import signal
import site
import stat
import sys
from pathlib import Path

GRADER_ROOT = Path(__file__).resolve().parents[2]   # the tree this grader runs from: its secret, staff files, code
RANK_USER = "student"                  # the user ranks run as where the grader runs as root
USER_ENV = "GRADING_RANK_USER"         # another user's name for that ("" or "-": stay root, without capabilities)
HIDE_ENV = "GRADING_HIDE"              # more paths (os.pathsep-separated) ranks must not read: a batch's others
ACCESS_LOG = "access.log"              # in a rank's folder: the attempts ``watch`` noted, one JSON line each
MAX_ATTEMPTS = 8                       # the most a rank notes of each kind of attempt
SANDBOX_FILE = "sandbox.json"          # in a rank's folder: what the worker applied and skipped

# A rank's environment: these names and prefixes of the parent's, never one that looks like a credential.
_ENV_NAMES = {"PATH", "HOME", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR", "VIRTUAL_ENV",
              "LD_LIBRARY_PATH", "PYTHONHASHSEED", "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE",
              "GRADING_THREADS", "GRADING_PROBLEMS", "TOKENIZERS_PARALLELISM"}
_ENV_PREFIXES = ("LC_", "PYTHON", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "CUDA", "NCCL_", "NVIDIA_", "TORCH", "PYTORCH_",
                 "GLOO_", "HF_", "TRANSFORMERS_", "DS_")
_CREDENTIAL = re.compile(r"SECRET|TOKEN|PASSW|KEY|CREDENTIAL|AUTH", re.IGNORECASE)

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 1
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 1, 24, 38
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAP_VERSION_3 = 0x20080522


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


# ------------------------------------------------------------------------------------------ parent side
def rank_environment(base: dict[str, str]) -> dict[str, str]:
    """The part of ``base`` (the parent's environment) a rank gets: the names and prefixes above that libraries
    and the kit read, never a name that looks like a credential (``GRADING_COURSE_SECRET``, ``HF_TOKEN``)."""
    return {name: value for name, value in base.items()
            if (name in _ENV_NAMES or name.startswith(_ENV_PREFIXES)) and not _CREDENTIAL.search(name)}


def rank_user() -> tuple[dict | None, str]:
    """``({"name", "uid", "gid"}, "")`` for the user ranks switch to, or ``(None, why not)``.

    Only a root grader switches: to ``GRADING_RANK_USER`` (default ``student``) when that user exists and can run
    this interpreter and its libraries (every folder above them searchable, the files readable by it)."""
    if os.geteuid() != 0:
        return None, "the grader is not root"
    name = os.environ.get(USER_ENV, RANK_USER)
    if name in ("", "-"):
        return None, f"{USER_ENV} asks to stay root"
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None, f"no user '{name}' on this machine"
    if entry.pw_uid == 0:
        return None, f"user '{name}' is root"
    for path in _interpreter_paths():
        if not _usable_by(path, entry.pw_uid, entry.pw_gid):
            return None, f"user '{name}' cannot use {path}"
    return {"name": name, "uid": entry.pw_uid, "gid": entry.pw_gid}, ""


def plan(kit_root: Path, code_root: Path, case_dir: Path, world_size: int) -> dict:
    """What the ranks of the case in ``case_dir`` (run on the grading copy ``code_root``) may read and write.

    ``hide``: the grader's tree ``kit_root`` and the ``GRADING_HIDE`` paths, less what a rank needs inside them
    (the interpreter, its libraries, ``code_root``, ``case_dir``): the folders and files around those are hidden
    one by one. ``writable``: each rank's own folder (``rank<R>``), made here, and the case's ``handoff`` and
    ``shared`` folders. ``guarded``: what ``watch`` notes a write into (the copy, the case). In a root grader the
    folders a rank writes belong to the ``user`` it switches to."""
    case_dir, code_root = Path(case_dir).resolve(), Path(code_root).resolve()
    keep = [*_interpreter_paths(), code_root, case_dir]
    hide_roots = [Path(kit_root).resolve(), *(Path(p).resolve() for p in os.environ.get(HIDE_ENV, "").split(os.pathsep) if p)]
    hide: list[str] = []
    for root in hide_roots:
        hide += [str(p) for p in _mask_targets(root, keep) if str(p) not in hide]
    user, why = rank_user()
    if user is not None:
        why = _open_the_way(user, [code_root, case_dir])
        user = None if why else user
    shared = [case_dir / "handoff", case_dir / "shared"]
    ranks = [case_dir / f"rank{rank}" for rank in range(world_size)]
    for folder in (*shared, *ranks):
        folder.mkdir(parents=True, exist_ok=True)
        if user is not None:
            os.chown(folder, user["uid"], user["gid"])
    return {"case_dir": str(case_dir), "hide": hide, "shared": [str(p) for p in shared],
            "guarded": [str(code_root), str(case_dir)], "user": user, "user_reason": why,
            "enabled": os.environ.get("GRADING_SANDBOX", "1") != "0"}


def _open_the_way(user: dict, paths: list[Path]) -> str:
    """Let ``user`` search every folder down to each of ``paths``: a grader's own temporary folder (under the
    temporary root) gets the others' search bit; "" when it can, else why not."""
    import tempfile
    parts = Path(tempfile.gettempdir()).resolve().parts
    temporary = Path(*parts[:2])                   # the temporary root: /tmp for /tmp/batch-1/grade-2
    for path in paths:
        for folder in reversed([path, *path.parents]):
            if _usable_by(folder, user["uid"], user["gid"], stat.S_IXUSR):
                continue
            st = folder.stat()
            if st.st_uid != os.geteuid() or not _within(folder, temporary) or folder == temporary:
                return f"user '{user['name']}' cannot reach {folder}"
            folder.chmod(stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
    return ""


def summary(applied: list[str], skipped: list[str]) -> str:
    """One line on what protection student code had, from a rank's ``enter`` report (``applied``, ``skipped``)."""
    if not applied and not skipped:
        return "student code ran with no isolation (GRADING_SANDBOX=0): it could read the course secret"
    text = "student code ran " + ", ".join(applied) if applied else "student code ran unisolated"
    return text + (f"; NOT applied: {'; '.join(skipped)}" if skipped else "")


def attempts(case_dir: Path, world_size: int) -> list[str]:
    """The attempts the ranks of ``case_dir`` noted (``watch``), one line each, without repeats."""
    found: list[str] = []
    for rank in range(world_size):
        text = read_rank_file(Path(case_dir) / f"rank{rank}" / ACCESS_LOG, 64 * 1024)
        for line in text.splitlines()[:4 * MAX_ATTEMPTS]:
            with contextlib.suppress(ValueError, TypeError, KeyError):
                entry = json.loads(line)
                note = f"tried to {entry['what']} {entry['path']}"
                if note not in found:
                    found.append(note)
    return found


def run_report(runs: Path, cases: list) -> tuple[str, list[str]]:
    """What a grade says of its ranks' view, from the case folders under ``runs`` (``cases``: the cases it ran,
    each with ``name``, ``world_size`` and ``criteria``): the protection line(s) of ``summary``, and one staff
    flag per sub-problem whose code tried to reach past its view (``attempts``; no points are deducted)."""
    lines: list[str] = []
    flags: dict[str, list[str]] = {}
    for case in cases:
        folder = Path(runs) / case.name
        for rank in range(case.world_size):
            with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
                done = json.loads(read_rank_file(folder / f"rank{rank}" / SANDBOX_FILE, 64 * 1024))["isolation"]
                line = summary(list(done["applied"]), list(done["skipped"]))
                if line not in lines:
                    lines.append(line)
        found = attempts(folder, case.world_size)
        if found:
            problem = case.criteria[0].problem
            flags.setdefault(problem, [])
            flags[problem] += [f for f in found if f not in flags[problem]]
    notes = [f"flagged for staff review (no points deducted): Problem {problem}'s code "
             + "; ".join(found[:3]) + (f" (and {len(found) - 3} more)" if len(found) > 3 else "")
             for problem, found in sorted(flags.items())]
    return " | ".join(lines), notes


def read_rank_file(path: Path, tail: int) -> str:
    """The last ``tail`` characters of a file a rank wrote, "" when it is missing, not a regular file, or a symlink
    (a rank could point one at a file only the grader may read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with open(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        handle.seek(max(0, handle.seek(0, os.SEEK_END) - tail))
        return handle.read().decode(errors="replace")


def read_rank_bytes(path: Path) -> bytes:
    """The bytes of a regular file a rank wrote; OSError for a symlink or anything else (``read_rank_file``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with open(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        return handle.read()


def _interpreter_paths() -> list[Path]:
    """The folders a rank's interpreter runs from: its prefix, its executable's folder, its site-packages."""
    paths = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)), *site.getsitepackages()]
    with contextlib.suppress(AttributeError):
        paths.append(site.getusersitepackages())
    return list(dict.fromkeys(Path(p).resolve() for p in paths if p and os.path.isdir(p)))


def _usable_by(path: Path, uid: int, gid: int, last: int = stat.S_IRUSR) -> bool:
    """Whether ``uid`` (group ``gid``) can search every folder down to ``path`` and has the permission ``last``
    (an owner bit: read by default) on ``path``."""
    def allowed(st: os.stat_result, bit_owner: int) -> bool:
        shift = 0 if st.st_uid == uid else 3 if st.st_gid == gid else 6
        return bool(st.st_mode & (bit_owner >> shift))
    current = Path("/")
    for part in path.parts[1:]:
        if not allowed(current.stat(), stat.S_IXUSR):
            return False
        current = current / part
    try:
        return allowed(path.stat(), last)
    except OSError:
        return False


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _mask_targets(root: Path, keep: list[Path]) -> list[Path]:
    """``root`` when it holds none of ``keep``; else its entries that hold none, recursively (``keep`` itself and
    the symlinks stay visible: a symlink leads to a path masked on its own or outside ``root``)."""
    try:
        if not root.exists() or any(_within(root, k) for k in keep):
            return []
    except OSError:                    # not even this grader's user may look: nor may its ranks
        return []
    if not any(_within(k, root) for k in keep):
        return [root]
    out: list[Path] = []
    with contextlib.suppress(OSError):
        for entry in sorted(root.iterdir()):
            if not entry.is_symlink():
                out += _mask_targets(entry, keep)
    return out


# ------------------------------------------------------------------------------------------ child side
def enter(spec: dict, rank: int) -> dict:
    """Give this rank process the view ``spec`` (a ``plan``) allows; return ``{"applied", "skipped"}``.

    Call with one thread, before student code. In new mount and PID namespaces (with a user namespace of this
    user when not root), the process forks once: this process waits for the child and ends with its status
    (``SystemExit``: a cold worker exits, a forked one returns to its fork server), and the child, the first
    process of its PID namespace, returns here as the rank. Never raises otherwise: a step that fails is listed
    under "skipped", and the rank runs with what worked."""
    done: dict = {"applied": [], "skipped": []}
    if not spec.get("enabled", True):
        return {"applied": [], "skipped": []}
    libc = ctypes.CDLL(None, use_errno=True)
    rank_dir = Path(spec["case_dir"]) / f"rank{rank}"
    user = spec.get("user")
    try:
        mode = _unshare(libc)
    except OSError as exc:
        done["skipped"].append(f"private namespaces: {exc}")
        _drop_capabilities(libc, done)
        return done
    _fork_into_namespace(libc)
    done["applied"].append(mode)
    try:                         # first: no mount of the rank's may reach the rest of the machine
        _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
    except OSError as exc:
        done["skipped"].append(f"a private file view: {exc}")
        _drop_capabilities(libc, done)
        return done
    steps = [("own processes only", lambda: _mount(libc, "proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)),
             ("private /dev/shm", lambda: _mount(libc, "tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV,
                                                  "size=256m,mode=1777")),
             ("the grader's files hidden", lambda: _hide(libc, spec["hide"])),
             ("other files read-only", lambda: _read_only_but(libc, [str(rank_dir), *spec["shared"]]))]
    for what, step in steps:
        try:
            step()
            done["applied"].append(what)
        except OSError as exc:
            done["skipped"].append(f"{what}: {exc}")
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
    import tempfile
    tempfile.tempdir = None
    return done


def watch(spec: dict, rank: int) -> None:
    """Note each attempt of this process to reach past its view: reading or listing a hidden path, writing into
    the grading copy or the case outside its own folders, or opening another process's ``/proc`` entry. One
    JSON line each (at most ``MAX_ATTEMPTS``) in the rank's ``access.log`` (``attempts`` reads them), through a
    ``sys.addaudithook`` hook, which code in the process cannot remove. A note for the staff, not a protection:
    ``enter`` protects."""
    if not spec.get("enabled", True):
        return
    rank_dir = Path(spec["case_dir"]) / f"rank{rank}"
    hidden = tuple(os.path.join(p, "") for p in spec["hide"])
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
        if real.startswith(hidden):
            note("write into" if writes else "read", real.rstrip("/"))
        elif writes and real.startswith(guarded) and not real.startswith(writable):
            note("write into", real.rstrip("/"))
        elif found and int(found.group(1)) != os.getpid():
            note("open another process's", real.rstrip("/"))

    sys.addaudithook(hook)


def _unshare(libc) -> str:
    """Enter new mount and PID namespaces, through a user namespace of this user when plain ones are refused;
    return how ("in private namespaces" or "in private namespaces of an unprivileged user namespace")."""
    if libc.unshare(_CLONE_NEWNS | _CLONE_NEWPID) == 0:
        return "in private namespaces"
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(_CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWUSER) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare: {os.strerror(errno)}")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    return "in private namespaces of an unprivileged user namespace"


def _fork_into_namespace(libc) -> None:
    """Fork; here (the waiter) wait for the child and end with its status; the child returns, as the rank."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    pid = os.fork()
    if pid == 0:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)     # it ends with the waiter
        return
    import faulthandler
    with contextlib.suppress(RuntimeError, ValueError):
        faulthandler.unregister(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)        # the launcher's stack-dump request is for the rank
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    raise SystemExit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


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


def _hide(libc, paths: list[str]) -> None:
    """Put an empty folder over each folder of ``paths`` and an empty file (``/dev/null``) over each file."""
    for path in paths:
        if os.path.isdir(path):
            _mount(libc, "tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=4k,mode=755")
        elif os.path.exists(path):
            _mount(libc, "/dev/null", path, None, _MS_BIND)


def _read_only_but(libc, writable: list[str]) -> None:
    """Make every mount read-only but ``writable`` (each a mount of its own) and ``/dev/shm``."""
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
