"""A submission that hunts for the course secret and edits the grader, graded in each place the kit grades.

The submission (``tests/kit/hostile.py``) walks the file tree and ``/proc`` for the secret, staff files and the
parent's environment, command line and memory, and appends to every ``checks.py`` and ``worker.py`` it finds.
Whatever it finds ends in its own exception message. In every mode: no secret or staff text reaches what the
grade writes, no grader file changes, Problem 1.1 keeps its full marks, and the staff report flags the attempt.

The modes: ``batch`` as root (this machine has no ``student`` user: ranks stay root without capabilities), a
``grade`` by an unprivileged user, and the Gradescope bundle run by root with a ``student`` user. The last two
need a user that can run this interpreter: where it lives under a folder only root may enter (``/root``), the
test runs in a mount namespace of its own where that folder is searchable (and, for Gradescope, where
``/etc/passwd`` names ``student``), as ``setup.sh`` would leave a Gradescope image. Nothing on the machine
changes.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from common import ROOT
from grading.engine.run_servers import POOL_ENV
from tests.kit.hostile import hostile_files

SECRET = "fall-secret-42-hostile"
NOBODY = 65534
STUDENT_UID = 61234
STAFF_TEXT = "def hidden_inputs"          # in every staff.py with hidden inputs

pytestmark = [pytest.mark.long_file,
              pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("unshare") is None
                                 or shutil.which("setpriv") is None or os.geteuid() != 0,
                                 reason="needs Linux, root and util-linux's unshare and setpriv to set the modes up")]


def _grader_digest() -> str:
    """One hash over every file of the kit's grader (its code, staff parts and data)."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "grading").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path).encode() + path.read_bytes())
    return digest.hexdigest()


def _open_folder(parent: str = "/tmp") -> Path:
    """A fresh folder in ``parent`` (not the session's ``TMPDIR``, which is root's alone) that every user may enter
    and write (the unprivileged grader writes its report and its temporary files there)."""
    folder = Path(tempfile.mkdtemp(prefix="hostile-", dir=parent))
    folder.chmod(0o777)
    return folder


def _write_submission(folder: Path) -> Path:
    for rel, text in hostile_files(ROOT).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o777 if path.is_dir() else 0o666)
    return folder


def _in_namespace(command: list[str], user: int | None = None, passwd: str = "", cover: tuple[Path, ...] = (),
                  drop: str = "", container: bool = False) -> list[str]:
    """``command`` in a mount namespace of its own (with ``container``, also a PID namespace and ``/proc``, as
    every container has: other processes of this machine stay out of sight) where this interpreter's folders are
    searchable by others (a tmpfs over a closed ``/root`` with the interpreter's folder bound back), ``cover`` is
    empty and, with
    ``passwd``, ``/etc/passwd`` and ``/etc/group`` hold that line; run as ``user`` (None: root), without the
    capabilities ``drop`` names (``setpriv``'s ``-sys_admin,-setfcap``)."""
    lines = ["set -e", "mount --make-rprivate /", *(f"mount -t tmpfs tmpfs {shlex.quote(str(p))}" for p in cover)]
    prefix = Path(sys.prefix).resolve()
    if prefix.parts[1:2] == ("root",) and not os.stat("/root").st_mode & 0o001:
        top = Path("/root", prefix.parts[2])
        lines += ['stage=$(mktemp -d)', 'mount --bind /root "$stage"', "mount -t tmpfs -o mode=755 tmpfs /root",
                  f"mkdir {shlex.quote(str(top))}",
                  f'mount --bind "$stage"/{shlex.quote(top.name)} {shlex.quote(str(top))}']
    if passwd:
        name, _, uid = passwd.split(":")[:3]
        lines += ['etc=$(mktemp -d)', 'cp /etc/passwd /etc/group "$etc"/',
                  f'echo {shlex.quote(passwd)} >> "$etc"/passwd', f'echo {name}:x:{uid}: >> "$etc"/group',
                  'mount --bind "$etc"/passwd /etc/passwd', 'mount --bind "$etc"/group /etc/group']
    run = shlex.join(command)
    if user is not None:
        run = f"setpriv --reuid={user} --regid={user} --clear-groups -- {run}"
    if drop:
        run = f"setpriv --bounding-set={drop} --inh-caps={drop} -- {run}"
    lines.append(f"exec {run}")
    own = ["--pid", "--fork", "--mount-proc"] if container else []
    return ["unshare", "--mount", "--propagation", "private", *own, "sh", "-c", "\n".join(lines)]


def _check(texts: list[str], results: dict, hidden: bool = True) -> None:
    """No secret or staff text in ``texts`` (stdout, stderr, reports); 1.1 in full; the attempt flagged."""
    for text in texts:
        assert SECRET not in text and STAFF_TEXT not in text and "LOOK" not in text, text[-3000:]
    tests = {t["name"].split(":")[0]: t for t in results["tests"]}
    failed = {name: t["output"] for name, t in tests.items() if name.startswith("1.1.") and t["status"] != "passed"}
    assert not failed, failed
    assert "flagged for staff review (no points deducted): Problem 1.1's code tried to" in results["output"]
    assert ("the grader's files hidden" in results["extra_data"]["protection"]) == hidden, results.get("extra_data")


def test_batch_as_root_keeps_the_secret_and_the_grader_from_a_hostile_submission(tmp_path):
    before = _grader_digest()
    subs = tmp_path / "subs"
    _write_submission(subs / "mallory")
    done = subprocess.run([sys.executable, "-m", "grading", "batch", str(subs), "--out", str(tmp_path / "g.csv"),
                           "--problem", "1.1", "--course-secret", SECRET, "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "GRADING_COURSE_SECRET": SECRET})
    assert done.returncode in (0, 1), done.stdout + done.stderr
    produced = [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file() and "subs" not in p.parts]
    results = json.loads(next((tmp_path / "g_results").rglob("results.json")).read_text())
    _check([done.stdout, done.stderr, *produced], results)
    assert "flagged for staff review" in (tmp_path / "g.csv").read_text()
    assert _grader_digest() == before


def test_an_unprivileged_grade_keeps_the_secret_and_the_grader_from_a_hostile_submission():
    before = _grader_digest()
    folder = _open_folder()
    try:
        submission = _write_submission(folder / "sub")
        out = folder / "results.json"
        command = ["env", "-u", POOL_ENV, f"HOME={folder}", f"TMPDIR={folder}", f"GRADING_COURSE_SECRET={SECRET}",
                   sys.executable, "-m", "grading",
                   "grade", str(submission), "--problem", "1.1", "--json", str(out), "--quiet"]
        done = subprocess.run(_in_namespace(command, user=NOBODY), cwd=ROOT, capture_output=True, text=True,
                              timeout=400)
        assert done.returncode in (0, 1), done.stdout + done.stderr
        results = json.loads(out.read_text())
        _check([done.stdout, done.stderr, out.read_text()], results)
        assert "unprivileged user namespace" in results["extra_data"]["protection"]
        assert _grader_digest() == before
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _autograder(folder: Path) -> Path:
    """The Gradescope bundle (made with ``SECRET`` in a folder of root's alone) unpacked into ``folder``/autograder
    as Gradescope lays it out, with the hostile submission; the root of that layout."""
    build = Path(tempfile.mkdtemp(prefix="bundle-"))
    try:
        done = subprocess.run([sys.executable, "-m", "grading", "gradescope", str(build / "out"), "--course-secret",
                               SECRET], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        root = folder / "autograder"
        with zipfile.ZipFile(build / "out" / "autograder.zip") as archive:
            archive.extractall(root / "source")
    finally:
        shutil.rmtree(build, ignore_errors=True)
    for name in ("setup.sh", "run_autograder"):
        (root / "source" / name).chmod(0o755)
    _write_submission(root / "submission")
    return root


def _only_the_bundle() -> tuple[Path, ...]:
    """What to cover so that this machine looks like a Gradescope container, which holds only the bundle: the
    kit checkout, every folder at / but the system's and ``/root``, ``/run``, ``/var``, ``/boot`` (the layout and
    the grade's temporary folders are in ``/var/tmp``), and in the folders on the way down to the checkout every
    folder beside that way (another checkout of the kit may lie there: ``/tmp/a`` beside ``/tmp/kit``); never
    the interpreter's folder or one above it."""
    from grading.sandbox.isolation import SYSTEM_DIRS
    kept = SYSTEM_DIRS | {"root", "run", "var", "boot"}
    way = {ROOT, *ROOT.parents}
    python = {p for place in (sys.executable, sys.prefix, sys.base_prefix)
              for p in (Path(place).resolve(), *Path(place).resolve().parents)}
    above = [Path("/"), *(p for p in reversed(ROOT.parents) if p != Path("/") and p.parts[1] not in kept)]
    return (ROOT, *(p for folder in above for p in sorted(folder.iterdir())
                    if p.is_dir() and not p.is_symlink() and p not in way and p not in python
                    and not (folder == Path("/") and p.name in kept)))


def _run_autograder(root: Path, passwd: str, drop: str = "") -> tuple[subprocess.CompletedProcess, dict]:
    (root.parent / "tmp").mkdir(mode=0o777, exist_ok=True)
    env = {**{k: v for k, v in os.environ.items() if k != POOL_ENV}, "AUTOGRADER_ROOT": str(root),
           "GRADING_PYTHON": sys.executable, "GRADING_ARGS": "--problem 1.1", "TMPDIR": str(root.parent / "tmp")}
    done = subprocess.run(_in_namespace([str(root / "source" / "run_autograder")], passwd=passwd,
                                        cover=_only_the_bundle(), drop=drop, container=True),
                          cwd=root, capture_output=True, text=True, timeout=400, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done, json.loads((root / "results" / "results.json").read_text())


PASSWD = f"student:x:{STUDENT_UID}:{STUDENT_UID}::/nonexistent:/usr/sbin/nologin"


def test_the_gradescope_bundle_runs_a_hostile_submission_as_the_student_user():
    folder = _open_folder("/var/tmp")
    try:
        root = _autograder(folder)
        before = {p: p.read_bytes() for p in (root / "source").rglob("*") if p.is_file()}
        done, results = _run_autograder(root, PASSWD)
        _check([done.stdout, done.stderr, (root / "results" / "results.json").read_text()], results)
        assert "as user 'student'" in results["extra_data"]["protection"], results["extra_data"]
        assert {p: p.read_bytes() for p in (root / "source").rglob("*") if p.is_file()
                and "__pycache__" not in p.parts} == {p: b for p, b in before.items() if "__pycache__" not in p.parts}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_container_without_namespaces_still_keeps_the_secret_after_setup_sh():
    """Docker's defaults (Gradescope's container): root without CAP_SYS_ADMIN, so no namespace; the ranks still
    run as ``student``, and ``setup.sh`` left ``source/`` to root alone. This machine's other folders are covered
    (``_only_the_bundle``): without namespaces, only file modes protect, and a container holds only the bundle."""
    folder = _open_folder("/var/tmp")
    try:
        root = _autograder(folder)
        setup = (root / "source" / "setup.sh").read_text()
        block = setup[setup.index("# The ranks that run student code"):]
        script = "set -e\ncd " + shlex.quote(str(root / "source")) + "\n" + block
        done = subprocess.run(_in_namespace(["bash", "-c", script], passwd=PASSWD), capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert not (root / "source" / "grading" / "staff" / "course_secret.txt").stat().st_mode & 0o077
        done, results = _run_autograder(root, PASSWD, drop="-sys_admin,-setfcap")
        _check([done.stdout, done.stderr, (root / "results" / "results.json").read_text()], results, hidden=False)
        protection = results["extra_data"]["protection"]
        assert "as user 'student'" in protection and "NOT applied: private namespaces" in protection, protection
        assert "warning: student code ran" in results["output"], results["output"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_course_secret_leaves_the_command_line():
    """``--course-secret S`` is moved into the environment at once: every user may read a command line."""
    proc = subprocess.Popen([sys.executable, "-m", "grading", "grade", "--problem", "1.1", "--course-secret", SECRET,
                             "--quiet"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={k: v for k, v in os.environ.items() if k != POOL_ENV})
    try:
        time.sleep(1.5)
        assert proc.poll() is None, "the grade ended before its command line was read"
        command_line = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert b"grade" in command_line and SECRET.encode() not in command_line, command_line
    finally:
        proc.kill()
        proc.wait()


def test_a_rank_sees_only_the_systems_folders_and_what_it_needs(tmp_path, monkeypatch):
    """Everything at / but the system's folders is covered, with the copy, the case and the interpreter attached
    again; a ``GRADING_HIDE`` path is covered too, even inside a system folder."""
    from grading.sandbox import isolation
    monkeypatch.setenv(isolation.HIDE_ENV, "/usr/share")
    view = isolation.plan(ROOT, tmp_path / "copy", tmp_path / "case", 2)
    covers = {c["root"]: c["keep"] for c in view["hide"]}
    assert "/usr/share" in covers and "/usr" not in covers and "/etc" not in covers
    assert str(tmp_path / "case") in covers["/tmp"] and str(tmp_path / "copy") in covers["/tmp"]
    kit = ROOT.resolve()
    holding = [root for root in covers if Path(root) == kit or Path(root) in kit.parents]
    assert holding and not any(Path(k) == kit or Path(k) in kit.parents for k in covers[holding[0]]), covers
    assert [(tmp_path / "case" / f"rank{r}").is_dir() for r in range(2)] == [True, True]


def test_the_reference_is_never_flagged(tmp_path):
    """Libraries write scratch files of their own (DeepSpeed probes its compiler in the working folder): only an
    attempt on an existing file is flagged, so the reference's grade carries no staff flag."""
    done = subprocess.run([sys.executable, "-m", "grading", "grade", "--problem", "3.3", "--quiet", "--json",
                           str(tmp_path / "r.json")], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "r.json").read_text())
    assert "flagged" not in results["output"] and "warning" not in results["output"], results["output"]
    assert "the grader's files hidden" in results["extra_data"]["protection"]


def test_torch_caches_go_to_the_ranks_own_folder(tmp_path, monkeypatch, fork_servers):
    """The grader's ``TORCHINDUCTOR_CACHE_DIR`` (set by a torch compile in its process) names a folder that is
    read-only in a rank; torch's copy of a weight view to the meta device (5.1's ``column_weight_view``) writes its
    cache in the rank's own folder instead, so that variant loses only its own criterion, whatever the grader's
    environment holds."""
    from grading.engine.runner import run_cases
    from grading.problems import sub_problem
    from grading.kit.variants import assert_verdicts, make_variant_kit
    from grading.commands.variants import declared
    variant = next(v for v in declared("5.1") if v.name == "column_weight_view")
    kit = make_variant_kit(tmp_path / "kit", variant.edits)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "grader_cache"))
    verdicts = run_cases(sub_problem("5.1").graded_cases()[:1], kit, tmp_path / "run", servers=fork_servers)
    assert_verdicts({v.id: v for v in verdicts}, [variant])
