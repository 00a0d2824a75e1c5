"""Resource limits and isolation for the rank processes that run student code.

Child side, ``apply_limits`` (the worker calls it before any student module is imported); parent side,
``Namespaces`` (the PID and loopback-only network namespaces a case's ranks share) and ``kill_marked`` (every
process that carries the run's marker). What student code may read and write is ``grading.sandbox.isolation``'s;
``docs/sandbox.md`` has both.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import select
import signal
import subprocess
import sys
from dataclasses import dataclass

import psutil

from common.process_tree import freeze_and_kill, signal_group
from common.settings import RUN_MARKER, settings     # RUN_MARKER: every rank (and its children) inherits it

CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWUSER = 0x40000000, 0x20000000, 0x10000000
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Limits:
    """Per-rank limits (None: not set). ``network`` False asks for a loopback-only namespace."""

    memory_mb: int | None = 8192
    cpu_s: int | None = None
    open_files: int | None = 4096
    file_mb: int | None = 256
    network: bool = False


def default_limits(timeout_s: float) -> Limits:
    """The limits for a case with wall-clock limit ``timeout_s``, from ``common.settings``: ``GRADING_SANDBOX=0``
    disables every limit and namespace; ``GRADING_MEMORY_MB``, ``GRADING_OPEN_FILES``, ``GRADING_FILE_MB`` (0:
    none) set the limits; ``GRADING_NETWORK=1`` keeps the host network."""
    chosen = settings()
    if not chosen.sandbox:
        return Limits(memory_mb=None, cpu_s=None, open_files=None, file_mb=None, network=True)
    return Limits(memory_mb=chosen.memory_mb or None, cpu_s=int(4 * timeout_s + 30),
                  open_files=chosen.open_files or None, file_mb=chosen.file_mb or None, network=chosen.network)


# ------------------------------------------------------------------------------------------ child side
def _set_limit(which: int, value: int) -> None:
    soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY and value > hard:
        value = hard
    resource.setrlimit(which, (value, value))


def apply_limits(spec: dict) -> dict:
    """Apply the limits and namespaces of a worker ``spec`` to this process; return what was done.

    Call before importing student code, while the process has one thread.
    The process dies with its parent (``PR_SET_PDEATHSIG``) and gets
    ``setrlimit`` limits on memory (``RLIMIT_DATA``), CPU seconds, open files
    and the size of any file it writes (``SIGXFSZ`` is ignored, so an
    over-long write raises ``OSError``). The case's namespaces are
    ``grading.sandbox.rank_view.enter``'s.
    ``spec["limits"]`` is a ``Limits`` as a dict. Never raises:
    a step that fails is listed under "skipped" with its reason.
    """
    done: dict = {"applied": [], "skipped": []}
    limits = spec.get("limits") or {}
    libc = None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        done["applied"].append("pdeathsig")
    except (OSError, AttributeError) as exc:
        done["skipped"].append(f"pdeathsig: {exc}")
    steps = [("memory_mb", resource.RLIMIT_DATA, 1024 * 1024), ("cpu_s", resource.RLIMIT_CPU, 1),
             ("open_files", resource.RLIMIT_NOFILE, 1), ("file_mb", resource.RLIMIT_FSIZE, 1024 * 1024)]
    for key, which, unit in steps:
        if limits.get(key):
            try:
                _set_limit(which, int(limits[key]) * unit)
                done["applied"].append(f"{key}={limits[key]}")
            except (OSError, ValueError) as exc:
                done["skipped"].append(f"{key}: {exc}")
    if limits.get("file_mb"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # an over-long write raises OSError(EFBIG)
    return done


# ------------------------------------------------------------------------------------------ parent side
_HOLDER = r"""
import ctypes, fcntl, os, signal, socket, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
flags, private_net = int(sys.argv[1]), sys.argv[2] == "1"
uid, gid = os.geteuid(), os.getegid()
if libc.unshare(flags) != 0:
    print("error unshare: " + os.strerror(ctypes.get_errno()), flush=True)
    sys.exit(1)
if flags & 0x10000000:                                  # a user namespace of this user, mapped to itself
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as handle:
            handle.write(text)
if private_net:                                         # bring loopback up in the new network namespace
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    got = fcntl.ioctl(s, 0x8913, struct.pack("16sh", b"lo", 0))                              # SIOCGIFFLAGS
    fcntl.ioctl(s, 0x8914, struct.pack("16sh", b"lo", struct.unpack("16sh", got)[1] | 1))   # SIOCSIFFLAGS IFF_UP
    s.close()
init = os.fork()
if init == 0:                     # the PID namespace's first process: it reaps, and ends with the holder
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.5)
print(f"ready {os.getpid()} {init}", flush=True)
sys.stdin.read()                # until the launcher closes the pipe (or dies)
"""


class Namespaces:
    """The namespaces one case's ranks share, held by a small holder process: a PID namespace (the ranks see
    each other and nothing else of the machine's processes), a loopback-only network namespace unless
    ``network``, and, where the grader is not root, the user namespace of its own user that owns them.

    ``paths`` maps "pid", "net" and "user" to the ``/proc/<pid>/ns/...`` files ranks join
    (``grading.sandbox.rank_view.enter``); it is empty (and ``reason`` says why) when none can be made (not
    Linux, or unshare refused). ``close()`` kills the holder and the PID namespace's first process: every
    process left in the namespace dies with it.
    """

    def __init__(self, network: bool = False, start_timeout_s: float = 10.0):
        self.paths: dict[str, str] = {}
        self.reason = ""
        self._proc: subprocess.Popen | None = None
        if not sys.platform.startswith("linux"):
            self.reason = "namespaces need Linux"
            return
        root = os.geteuid() == 0
        flags = CLONE_NEWPID | (0 if network else CLONE_NEWNET) | (0 if root else CLONE_NEWUSER)
        try:
            # -I -S: the holder needs the standard library only (no site-packages, no PYTHON* settings), and one
            # starts for every case: the lighter start (docs/design.md, "Measurements")
            self._proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _HOLDER, str(flags),
                                           "0" if network else "1"],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          start_new_session=True, env={})    # ranks see it: it holds no secret
        except OSError as exc:
            self.reason = f"cannot start the namespace holder: {exc}"
            return
        answered = select.select([self._proc.stdout], [], [], start_timeout_s)[0]     # one line, written at once
        line = self._proc.stdout.readline().decode(errors="replace").strip() if answered else ""
        if not line.startswith("ready "):
            self.reason = f"namespace holder failed: {line or 'no answer'}"
            self.close()
            return
        holder, init = (int(field) for field in line.split()[1:3])
        self.paths = {"pid": f"/proc/{init}/ns/pid", **({} if network else {"net": f"/proc/{holder}/ns/net"}),
                      **({} if root else {"user": f"/proc/{holder}/ns/user"})}

    @classmethod
    def none(cls) -> Namespaces:
        """No namespaces (the sandbox is off): empty ``paths``."""
        empty = cls.__new__(cls)
        empty.paths, empty.reason, empty._proc = {}, "the sandbox is off (GRADING_SANDBOX=0)", None
        return empty

    def members(self) -> list[int]:
        """Pids of the processes in the case's PID namespace other than its first (the ranks and whatever they
        left running); empty without one."""
        try:
            namespace = os.readlink(self.paths["pid"])
        except (KeyError, OSError):
            return []
        first = int(self.paths["pid"].split("/")[2])
        found = []
        for pid in psutil.pids():
            with contextlib.suppress(OSError):
                if pid != first and os.readlink(f"/proc/{pid}/ns/pid") == namespace:
                    found.append(pid)
        return found

    def close(self) -> None:
        """Kill the holder and the namespace's first process (idempotent)."""
        if self._proc is None:
            return
        signal_group(self._proc.pid, signal.SIGKILL)
        for stream in (self._proc.stdin, self._proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)
        self._proc = None


def find_marked(run_id: str) -> list[int]:
    """Pids (other than this process) whose environment holds ``GRADING_RUN_ID=<run_id>``."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.environ().get(RUN_MARKER) == run_id:
                found.append(process.pid)
        except psutil.Error:           # gone meanwhile, or not ours to read
            continue
    return found


def kill_marked(run_id: str, rounds: int = 20) -> list[int]:
    """Stop, then kill, every process carrying the run's marker; return their pids (``freeze_and_kill``). Best
    effort: a process that dropped the marker from its environment is not found."""
    return freeze_and_kill(lambda: find_marked(run_id), rounds)
