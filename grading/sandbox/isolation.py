"""What student code may see and touch, the grader's half: each rank gets a view of the machine without the keys.

``plan`` says what a case's ranks may not read (the grader's own tree: the course secret, every ``staff.py``, the
hidden checks; the ``GRADING_HIDE`` paths), what each may write (its own record folder, the case's hand-off and
store folders) and which user they run as; ``rank_environment`` is all of the parent's environment a rank gets.
The rank's half, ``grading.sandbox.rank_view``, makes that view and notes each attempt to reach past it;
``run_report`` turns a grade's ranks' reports into its protection line and staff flags, and ``read_rank_file``
reads what a rank wrote without following its links.

A rank sees, after ``rank_view.enter``:

* the processes of its own case only (the case's PID namespace, ``sandbox.Namespaces``, with its own ``/proc``):
  no other process's environment, command line or memory, and no process outside to signal;
* of the file tree, the system's folders (``SYSTEM_DIRS``), the interpreter, the grading copy and its case's
  folder; everything else (the grader's tree, homes, ``/tmp``, ``GRADING_HIDE`` paths) is an empty folder (a
  mount namespace of its own);
* every file read-only, but for its own folders and its case's ``/dev/shm``;
* as root: the unprivileged user ``plan`` names (``student``, made by the Gradescope bundle's ``setup.sh``) where
  the interpreter is usable by it, and no capability either way.

Without root the namespaces come from a user namespace of the grader's own user (Linux's unprivileged user
namespaces). ``summary`` says in one line what a run got; ``docs/sandbox.md`` has the table per place.
"""
from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import site
import stat
import sys
from pathlib import Path

from common import ROOT
from common.files import read_regular
from common.settings import HIDE_ENV as HIDE_ENV      # re-exported: tests name isolation.HIDE_ENV
from common.settings import PROBLEMS_ENV, THREADS_ENV, USER_ENV, settings

GRADER_ROOT = ROOT   # the tree this grader runs from: its secret, staff files, code
ACCESS_LOG = "access.log"              # in a rank's folder: the attempts ``watch`` noted, one JSON line each
MAX_ATTEMPTS = 8                       # the most a rank notes of each kind of attempt
SANDBOX_FILE = "sandbox.json"          # in a rank's folder: what the worker applied and skipped
SYSTEM_DIRS = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "sys", "usr"}  # ranks see these

# A rank's environment: these names and prefixes of the parent's, never one that looks like a credential.
_ENV_NAMES = {"PATH", "HOME", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR", "VIRTUAL_ENV",
              "LD_LIBRARY_PATH", "PYTHONHASHSEED", "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE",
              THREADS_ENV, PROBLEMS_ENV, "TOKENIZERS_PARALLELISM"}
_ENV_PREFIXES = ("LC_", "PYTHON", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "CUDA", "NCCL_", "NVIDIA_", "TORCH", "PYTORCH_",
                 "GLOO_", "HF_", "TRANSFORMERS_", "DS_")
_CREDENTIAL = re.compile(r"SECRET|TOKEN|PASSW|KEY|CREDENTIAL|AUTH", re.IGNORECASE)

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
    name = settings().rank_user
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


def plan(grader_root: Path, code_root: Path, case_dir: Path, world_size: int) -> dict:
    """What the ranks of the case in ``case_dir`` (run on the grading copy ``code_root``) may read and write.

    ``hide``: the grader's tree ``grader_root``, the ``GRADING_HIDE`` paths and everything at ``/`` but the system's
    folders (``_private_top_level``), each ``{"root", "keep"}``: the rank sees the root empty but for what it
    needs inside it (the interpreter, its libraries, ``code_root``, ``case_dir``), also what is made there later.
    ``writable``: each rank's own folder (``rank<R>``), made here, and the case's ``handoff``, ``shared`` (stores)
    and ``shm`` (its ``/dev/shm``) folders. ``guarded``: what ``rank_view.watch`` notes a write into (the copy,
    the case). In a root grader the folders a rank writes belong to the ``user`` it switches to."""
    case_dir, code_root = Path(case_dir).resolve(), Path(code_root).resolve()
    keep = [*_interpreter_paths(), code_root, case_dir]
    hide_roots = [Path(grader_root).resolve(), *(Path(p).resolve() for p in settings().hide), *_private_top_level()]
    hide = _covers(hide_roots, keep)
    user, why = rank_user()
    if user is not None:
        why = _open_the_way(user, [code_root, case_dir])
        user = None if why else user
    if user is not None:
        _readable_by_all(code_root)
    shared = [case_dir / "handoff", case_dir / "shared", case_dir / "shm"]
    ranks = [case_dir / f"rank{rank}" for rank in range(world_size)]
    for folder in (*shared, *ranks):
        folder.mkdir(parents=True, exist_ok=True)
        if user is not None:
            os.chown(folder, user["uid"], user["gid"])
    return {"case_dir": str(case_dir), "hide": hide, "shared": [str(p) for p in shared],
            "guarded": [str(code_root), str(case_dir)], "user": user, "user_reason": why,
            "enabled": settings().sandbox}


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


def _readable_by_all(root: Path) -> None:
    """Give every user read access to the grading copy ``root`` (search on its folders): a copy of a kit whose
    files only root may read (a Gradescope ``source/`` after ``setup.sh``) keeps those modes."""
    for folder, folders, files in os.walk(root):
        for path, bits in [(folder, 0o005), *((os.path.join(folder, f), 0o004) for f in files)]:
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            if mode & bits != bits and not os.path.islink(path):
                os.chmod(path, mode | bits)


def summary(applied: list[str], skipped: list[str]) -> str:
    """One line on what protection student code had, from a rank's ``enter`` report (``applied``, ``skipped``)."""
    if not applied and not skipped:
        return "student code ran with no isolation (GRADING_SANDBOX=0): it could read the course secret"
    text = "student code ran " + ", ".join(applied) if applied else "student code ran unisolated"
    return text + (f"; NOT applied: {'; '.join(skipped)}" if skipped else "")


def attempts(case_dir: Path, world_size: int) -> list[str]:
    """The attempts the ranks of ``case_dir`` noted (``rank_view.watch``), one line each, without repeats."""
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
    """The last ``tail`` bytes of a file a rank wrote, as text; "" when it is missing, not a regular file, or a
    symlink (a rank could point one at a file only the grader may read: ``common.files.read_regular``)."""
    try:
        return read_regular(path, tail=tail).decode(errors="replace")
    except OSError:
        return ""


def read_rank_bytes(path: Path) -> bytes:
    """The bytes of a regular file a rank wrote; OSError for a symlink or anything else (``read_rank_file``)."""
    return read_regular(path)


def _private_top_level() -> list[Path]:
    """The folders and files at ``/`` beside the system's own (``SYSTEM_DIRS``): homes, ``/tmp``, ``/run``, mounted
    data, a Gradescope image's ``/autograder``; a rank sees of them only what it needs (``plan``'s ``keep``)."""
    with contextlib.suppress(OSError):
        return [entry for entry in sorted(Path("/").iterdir())
                if entry.name not in SYSTEM_DIRS and not entry.is_symlink()]
    return []


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
    try:
        for part in path.parts[1:]:
            if not allowed(current.stat(), stat.S_IXUSR):
                return False
            current = current / part
        return allowed(path.stat(), last)
    except OSError:
        return False


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _covers(roots: list[Path], keep: list[Path]) -> list[dict]:
    """``{"root", "keep"}`` for each of ``roots`` that exists, is not inside another of them and is not needed
    whole (inside a ``keep`` path): ``keep`` lists the outermost of ``keep`` inside it."""
    out: list[dict] = []
    for root in roots:
        try:
            if not root.exists() or any(_within(root, k) for k in keep):
                continue
        except OSError:                # not even this grader's user may look: nor may its ranks
            continue
        if any(other != root and _within(root, other) for other in roots) or str(root) in (c["root"] for c in out):
            continue
        inside = [k for k in keep if _within(k, root)]
        outermost = [k for k in inside if not any(o != k and _within(k, o) for o in inside)]
        out.append({"root": str(root), "keep": sorted({str(k) for k in outermost})})
    return out
