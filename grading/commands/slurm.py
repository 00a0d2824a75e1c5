"""Grade a class as a Slurm array job: ``python -m grading batch SUBMISSIONS --slurm OUT_DIR [...]``, then merge
its results: ``python -m grading batch --collect OUT_DIR --out grades.csv``.

``write_array`` writes the task list, the array script and its submit step into OUT_DIR, ``submit`` checks the
course secret before ``sbatch``, ``run_task`` grades one task, on any machine, and ``collect`` writes
``grades.csv`` and the class report for the finished tasks, exactly as ``batch`` would, and sorts out the tasks
that need another run. The kit, its Python environment, the submissions and OUT_DIR must sit on a filesystem every
node sees.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import ROOT
from grading.commands.batch import (NOTE_SEPARATOR, UNSCORED, class_report_inputs, default_limit_s, grade_one,
                                    submissions_in, write_grades)
from grading.commands.class_report import write_class_report
from grading.commands.grades_csv import RowStatus, criterion_cells
from grading.commands.options import DEFAULT_CPUS, DEFAULT_MEM
from grading.commands.report import EXIT_GRADER_ERROR
from common.files import atomic_write
from common.settings import PROBLEMS_ENV, SECRET_ENV, settings
from grading.kit.course import parse_problems
from grading.kit.secret import course_secret

TASKS, SCRIPT, RESULTS, LOGS, ROW = "tasks.json", "grade.sbatch", "results", "logs", "row.json"
SUBMIT, RESUBMIT = "submit.sh", "resubmit.sh"
NODE_LOCAL = ("/tmp", "/var/tmp", "/dev/shm")     # each node has its own: never shared across nodes
ATTEMPT_PREFIX = ".attempt-"
BENCH_LIMIT_S = 3600.0
START_SLACK_S = 120.0
RERUN_STATUSES = UNSCORED          # a task whose row has one of these needs another run
_TIME = re.compile(r"(?:(\d+)-)?(\d{1,3}):(\d{2}):(\d{2})")
_PARTITION = re.compile(r"[A-Za-z0-9_.,-]+")
_MEMORY = re.compile(r"[1-9]\d*[KMGT]?")
# The long options grade.sbatch may carry, and a check of each value (sbatch --test-only style, by parsing).
DIRECTIVES = {"job-name": re.compile(r"[A-Za-z0-9_.-]+"), "array": re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*(%\d+)?"),
              "ntasks": re.compile(r"[1-9]\d*"), "time": _TIME, "output": re.compile(r"/\S+"),
              "error": re.compile(r"/\S+"), "partition": _PARTITION, "gpus-per-task": re.compile(r"[1-9]\d*"),
              "cpus-per-task": re.compile(r"[1-9]\d*"), "mem": _MEMORY, "account": _PARTITION}


# Making the array: its task list, its script and the step that submits it.


@dataclass
class ArrayJob:
    """What ``write_array`` wrote: the script, the task list, the number of tasks and the command to submit."""

    script: Path
    tasks: Path
    count: int
    submit: str


def parse_time(text: str) -> float:
    """Seconds of a Slurm time limit ``[D-]HH:MM:SS``; ValueError for anything else."""
    match = _TIME.fullmatch(text.strip())
    if not match or int(match[3]) > 59 or int(match[4]) > 59:
        raise ValueError(f"--time must look like HH:MM:SS or D-HH:MM:SS, got {text!r}")
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def format_time(seconds: float) -> str:
    """``HH:MM:SS`` of ``seconds``, rounded up to a whole minute."""
    minutes = int(-(-seconds // 60))
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def array_spec(ids: list[int], max_parallel: int | None = None) -> str:
    """Slurm's ``--array`` value for ``ids``: ranges joined by commas, ``%K`` throttle (``[0,1,2,5]`` -> ``0-2,5``)."""
    ids, parts, k = sorted(set(ids)), [], 0
    while k < len(ids):
        end = k
        while end + 1 < len(ids) and ids[end + 1] == ids[end] + 1:
            end += 1
        parts.append(str(ids[k]) if end == k else f"{ids[k]}-{ids[end]}")
        k = end + 1
    return ",".join(parts) + (f"%{max_parallel}" if max_parallel else "")


def secret_fingerprint(salt: str, secret: str) -> str:
    """A salted hash of the course secret, so a task can tell it runs under the secret the array was made with."""
    return hashlib.sha256(f"{salt}\0{secret}".encode()).hexdigest()


def secret_mismatch(tasks: dict) -> str | None:
    """Why this process's course secret is not the one ``tasks`` (a ``tasks.json``) was made with, with the fix,
    in one line; None when it is."""
    secret = course_secret()
    if secret_fingerprint(tasks["secret_salt"], secret) == tasks["secret"]:
        return None
    remake = "or make the array again (batch --slurm) from this shell"
    if not tasks.get("secret_used", True):
        return f"the array was made without a course secret but {SECRET_ENV} is set here: unset it, {remake}"
    if not secret:
        return f"the array was made with a course secret and none is set here: set {SECRET_ENV} to it, {remake}"
    return f"this course secret differs from the one the array was made with: set {SECRET_ENV} to that one, {remake}"


def shared_paths(python: str, submissions_dir: Path | str, out_dir: Path | str) -> dict[str, Path | str]:
    """What every node must see at the same path (what -> path): the kit, its Python environment, the submissions
    and OUT_DIR."""
    return {"the kit": ROOT, "the Python environment": python, "SUBMISSIONS_DIR": submissions_dir,
            "OUT_DIR": out_dir}


def node_local(paths: dict[str, Path | str]) -> list[str]:
    """A warning for each of ``paths`` (what -> path) under a node's own folder, ``NODE_LOCAL``."""
    return [f"{what} {path} is under {root}, which other nodes do not see: use a filesystem every node shares"
            for what, path in paths.items() for root in NODE_LOCAL
            if Path(path) == Path(root) or Path(root) in Path(path).parents]


def write_array(submissions_dir: Path, out_dir: Path, grade_args: list[str] | None = None, partition: str | None = None,
                gpus_per_task: int = 0, time_limit: str | None = None, benchmarks: bool = False,
                max_parallel: int | None = None, python: str = sys.executable, cpus_per_task: int = DEFAULT_CPUS,
                mem: str = DEFAULT_MEM, account: str | None = None) -> ArrayJob:
    """Write ``tasks.json`` and ``grade.sbatch`` for every entry of ``submissions_dir`` into ``out_dir``.

    ``time_limit`` (``[D-]HH:MM:SS``) bounds each task; by default the sum of
    the grade limit (``batch.default_limit_s``), the benchmark limit with
    ``benchmarks`` and start-up slack. The grade (and benchmark) limits inside
    a task are cut to fit it. Each task asks for ``cpus_per_task`` CPUs and ``mem``
    memory (Slurm's ``--mem``: a number with an optional K/M/G/T suffix);
    ``partition`` and ``account`` go into the script only when given. It records whether a course secret was
    used (``secret_mismatch``) and writes ``submit.sh``, which checks it before ``sbatch``. The script's body
    needs nothing Slurm-only: it runs ``python -m grading batch --run-task OUT_DIR $SLURM_ARRAY_TASK_ID``
    (``run_task``), so any machine can run a task. A path the nodes
    must share under ``NODE_LOCAL`` is warned about on stderr and in the script. Raises ValueError for a bad
    option, an empty folder, or an OUT_DIR path with whitespace or ``%`` (Slurm's directives take no quoting).
    """
    grade_args = list(grade_args or [])
    out_dir, submissions_dir = Path(out_dir).resolve(), Path(submissions_dir).resolve()
    _check_array_options(out_dir, partition, account, gpus_per_task, max_parallel, cpus_per_task, mem)
    entries = submissions_in(submissions_dir)
    if not entries:
        raise ValueError(f"{submissions_dir}: no submissions (folders or .zip files)")
    time_limit, grade_limit, bench_limit = _task_limits(grade_args, benchmarks, time_limit)
    env = {PROBLEMS_ENV: settings().problems} if settings().problems else {}
    tasks = _task_list(submissions_dir, entries, grade_args, grade_limit, benchmarks, bench_limit, env, max_parallel,
                       python)
    (out_dir / LOGS).mkdir(parents=True, exist_ok=True)
    (out_dir / RESULTS).mkdir(exist_ok=True)
    atomic_write(out_dir / TASKS, json.dumps(tasks, indent=1) + "\n")
    warnings = node_local(shared_paths(python, submissions_dir, out_dir))
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    submit = _write_submit_step(out_dir, python)
    sbatch_lines = _sbatch_directives(len(entries), out_dir, time_limit, max_parallel, cpus_per_task, mem, partition,
                                      account, gpus_per_task)
    lines = [*_script_header(len(entries), submissions_dir, out_dir, python, warnings), *sbatch_lines,
             *_script_body(len(entries), out_dir, python)]
    script = atomic_write(out_dir / SCRIPT, "\n".join(lines) + "\n")
    os.chmod(script, 0o755)
    return ArrayJob(script, out_dir / TASKS, len(entries), f"bash {shlex.quote(str(submit))}")


def _check_array_options(out_dir: Path, partition: str | None, account: str | None, gpus_per_task: int,
                         max_parallel: int | None, cpus_per_task: int, mem: str) -> None:
    """ValueError naming the first option of ``write_array`` that cannot go into ``grade.sbatch``."""
    if re.search(r"[\s%]", str(out_dir)):
        raise ValueError(f"{out_dir}: an OUT_DIR path with whitespace or '%' cannot go into #SBATCH lines")
    if partition is not None and not _PARTITION.fullmatch(partition):
        raise ValueError(f"--partition: not a partition name: {partition!r}")
    if account is not None and not _PARTITION.fullmatch(account):
        raise ValueError(f"--account: not an account name: {account!r}")
    if gpus_per_task < 0 or (max_parallel is not None and max_parallel < 1):
        raise ValueError("--gpus-per-task must be >= 0 and --max-parallel >= 1")
    if cpus_per_task < 1:
        raise ValueError(f"--cpus-per-task must be >= 1, got {cpus_per_task}")
    if not _MEMORY.fullmatch(str(mem)):
        raise ValueError(f"--mem: not a Slurm memory size (a number with an optional K, M, G or T, e.g. 3G or 3000M): "
                         f"{mem!r}")


def _task_limits(grade_args: list[str], benchmarks: bool, time_limit: str | None) -> tuple[str, float, float]:
    """``(--time, grade limit s, benchmark limit s)`` of one task: ``time_limit`` (default: both limits plus
    ``START_SLACK_S``), with the limits cut to fit it; ValueError when it leaves under a minute to grade."""
    grade_limit = default_limit_s(grade_args)
    bench_limit = BENCH_LIMIT_S if benchmarks else 0.0
    if time_limit is None:
        time_limit = format_time(grade_limit + bench_limit + START_SLACK_S)
    budget = parse_time(time_limit) - START_SLACK_S
    if benchmarks:
        bench_limit = min(bench_limit, budget / 2)
    grade_limit = min(grade_limit, budget - bench_limit)
    if grade_limit < 60:
        raise ValueError(f"--time {time_limit} leaves {grade_limit:.0f} s to grade; give at least "
                         f"{format_time(60 + bench_limit + START_SLACK_S)}")
    return time_limit, grade_limit, bench_limit


def _task_list(submissions_dir: Path, entries: list[Path], grade_args: list[str], grade_limit: float,
               benchmarks: bool, bench_limit: float, env: dict[str, str], max_parallel: int | None,
               python: str) -> dict:
    """The content of ``tasks.json``: one task per entry, what each task runs with, and a salted fingerprint of
    this process's course secret (``secret_mismatch``)."""
    salt = secrets.token_hex(8)
    return {"batch": secrets.token_hex(8), "submissions_dir": str(submissions_dir), "grade_args": grade_args,
            "limit_s": grade_limit, "benchmarks": benchmarks, "benchmark_limit_s": bench_limit, "env": env,
            "secret_salt": salt, "secret": secret_fingerprint(salt, course_secret()),
            "secret_used": bool(course_secret()), "max_parallel": max_parallel, "python": python,
            "tasks": [{"id": k, "submission": e.name, "path": str(e)} for k, e in enumerate(entries)]}


def _write_submit_step(out_dir: Path, python: str) -> Path:
    """Write the executable ``submit.sh``: ``submit`` (the secret check, then ``sbatch``) with its arguments."""
    submit = atomic_write(out_dir / SUBMIT, "\n".join([
        "#!/bin/bash",
        f"# Submits {SCRIPT} (extra arguments go to sbatch) once this shell's course secret is the array's.",
        "set -euo pipefail", f"cd {shlex.quote(str(ROOT))}",
        f'exec "${{GRADING_PYTHON:-{shlex.quote(python)}}}" -m grading.commands.slurm submit '
        f'{shlex.quote(str(out_dir))} "$@"']) + "\n")
    os.chmod(submit, 0o755)
    return submit


def _script_header(count: int, submissions_dir: Path, out_dir: Path, python: str, warnings: list[str]) -> list[str]:
    """The comment lines that open ``grade.sbatch``: what it grades, how to submit it or run one task, the paths
    every node must share and the warnings about them."""
    return [
        "#!/bin/bash",
        f"# Grades the {count} submissions of {submissions_dir.name}/, one per array task (see {TASKS}).",
        f"# Submit: bash {out_dir / SUBMIT} (checks the course secret, then sbatch {out_dir / SCRIPT})",
        f"# One task on any machine: SLURM_ARRAY_TASK_ID=3 bash {out_dir / SCRIPT}",
        "# The course secret is not stored here: submit from a shell where GRADING_COURSE_SECRET is set.",
        "# Every node must see, at these paths (a shared filesystem): the kit, its Python environment,",
        f"# the submissions and this folder: {ROOT}, {python}, {submissions_dir}, {out_dir}",
        *(f"# WARNING: {warning}" for warning in warnings)]


def _sbatch_directives(count: int, out_dir: Path, time_limit: str, max_parallel: int | None, cpus_per_task: int,
                       mem: str, partition: str | None, account: str | None, gpus_per_task: int) -> list[str]:
    """The ``#SBATCH`` lines of an array of ``count`` tasks (partition, account and GPUs only when given)."""
    return ["#SBATCH --job-name=a5-grade", f"#SBATCH --array={array_spec(list(range(count)), max_parallel)}",
            "#SBATCH --ntasks=1", f"#SBATCH --cpus-per-task={cpus_per_task}", f"#SBATCH --mem={mem}",
            f"#SBATCH --time={time_limit}",
            f"#SBATCH --output={out_dir / LOGS}/task-%a.out", f"#SBATCH --error={out_dir / LOGS}/task-%a.err",
            *([f"#SBATCH --partition={partition}"] if partition else []),
            *([f"#SBATCH --account={account}"] if account else []),
            *([f"#SBATCH --gpus-per-task={gpus_per_task}"] if gpus_per_task else [])]


def _script_body(count: int, out_dir: Path, python: str) -> list[str]:
    """The commands of ``grade.sbatch``: nothing Slurm-only, ``run_task`` of ``$SLURM_ARRAY_TASK_ID``."""
    return ["set -euo pipefail",
            'if [ -z "${SLURM_ARRAY_TASK_ID:-}" ]; then',
            f'  echo "set SLURM_ARRAY_TASK_ID to the task to grade (0-{count - 1})" >&2; exit 2',
            "fi",
            f'PYTHON="${{GRADING_PYTHON:-{shlex.quote(python)}}}"',
            f"cd {shlex.quote(str(ROOT))}",
            f'exec "$PYTHON" -m grading batch --run-task {shlex.quote(str(out_dir))} "$SLURM_ARRAY_TASK_ID"']


# Submitting the array, and checking its script as sbatch would.


def submit(out_dir: Path, sbatch_args: list[str] | None = None) -> int:
    """The submit step: ``sbatch [sbatch_args] OUT_DIR/grade.sbatch`` and its exit code, or 2 (nothing submitted)
    with the reason and its fix in one line on stderr when ``tasks.json`` is unreadable, this process's course
    secret is not the array's, or there is no ``sbatch`` to run. Repeats every warning ``write_array`` gave about
    paths under ``NODE_LOCAL`` (the kit, the Python environment: ``GRADING_PYTHON`` if set, SUBMISSIONS_DIR,
    OUT_DIR)."""
    out_dir = Path(out_dir).resolve()
    try:
        tasks = json.loads((out_dir / TASKS).read_text())
        problem = secret_mismatch(tasks)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        problem = f"{out_dir / TASKS} is not a task list of batch --slurm ({type(exc).__name__}: {exc})"
    if problem:
        print(f"error: not submitted: {problem}", file=sys.stderr)
        return 2
    python = settings().python or str(tasks.get("python", sys.executable))
    for warning in node_local(shared_paths(python, tasks["submissions_dir"], out_dir)):
        print(f"warning: {warning}", file=sys.stderr)
    try:
        return subprocess.run(["sbatch", *(sbatch_args or []), str(out_dir / SCRIPT)]).returncode
    except OSError as exc:             # no sbatch on PATH (FileNotFoundError), or one that cannot run
        print("error: not submitted: " + (f"no sbatch on this machine's PATH: submit from a Slurm login node, or "
              f"run one task here with SLURM_ARRAY_TASK_ID=0 bash {out_dir / SCRIPT}" if isinstance(
                  exc, FileNotFoundError) else f"sbatch could not run ({type(exc).__name__}: {exc})"), file=sys.stderr)
        return 2


def directives(script_text: str) -> list[tuple[str, str]]:
    """The ``#SBATCH --name=value`` pairs sbatch would read: those before the first command line of the script."""
    found = []
    for line in script_text.splitlines()[1:]:
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if stripped.startswith("#SBATCH"):
            name, _, value = stripped[len("#SBATCH"):].strip().removeprefix("--").partition("=")
            found.append((name, value))
    return found


def check_script(path: Path, count: int) -> list[str]:
    """Problems sbatch would refuse (``--test-only`` style, by parsing); [] for a good script of ``count`` tasks."""
    text = Path(path).read_text()
    problems = [] if text.startswith("#!") else ["the script does not start with #!"]
    found = directives(text)
    names = [n for n, _ in found]
    problems += [f"#SBATCH --{n} given {names.count(n)} times" for n in set(names) if names.count(n) > 1]
    for name, value in found:
        pattern = DIRECTIVES.get(name)
        if pattern is None or not pattern.fullmatch(value):
            problems.append(f"#SBATCH --{name}={value}: " + ("unknown option" if pattern is None else "bad value"))
        elif name in ("output", "error") and not Path(value).parent.is_dir():
            problems.append(f"#SBATCH --{name}: folder {Path(value).parent} does not exist")
    spec = dict(found).get("array", "")
    ids = {int(x) for part in spec.split("%")[0].split(",") if part
           for x in (range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1) if "-" in part else [part])}
    if ids != set(range(count)):
        problems.append(f"#SBATCH --array={spec} does not cover tasks 0-{count - 1} exactly")
    return problems + [f"#SBATCH --{n} missing" for n in ("array", "time", "output", "error") if n not in names]


# Running one task, on any machine.


def _run_benchmarks(path: str, out: Path, limit_s: float) -> tuple[dict, str]:
    """Run ``python -m grading benchmarks`` into ``out/benchmarks.json``; (its data, status)."""
    target = out / "benchmarks.json"
    command = [sys.executable, "-m", "grading", "benchmarks", path, "--json", str(target), "--limit", f"{limit_s:g}"]
    with open(out / "benchmarks.txt", "wb") as log:
        try:
            code = subprocess.run(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=limit_s + START_SLACK_S, start_new_session=True).returncode
        except subprocess.TimeoutExpired:
            code = None
    try:
        data = json.loads(target.read_text())
    except (OSError, ValueError):
        return {"tests": []}, "error" if code != 2 else "rejected"
    if not any(float(t.get("max_score", 0) or 0) > 0 for t in data.get("tests", [])):
        return data, "not_applicable"
    return data, "passed" if code == 0 else "failed"


def run_task(out_dir: Path, task_id: int) -> int:
    """Grade task ``task_id`` of ``out_dir/tasks.json`` into ``out_dir/results/<name>/``; 0 when a grade was kept.

    A task whose grade did not finish or hit a grader error (``batch.UNSCORED``), or that runs under another
    course secret than the array was made with, keeps a row with its partial score (blank when it judged
    nothing) whose notes say why, prints
    the reason on stderr and returns ``EXIT_GRADER_ERROR`` (Slurm shows the task as failed).

    The grade runs in ``results/.attempt-<task_id>-...``, which replaces
    ``results/<name>`` whole when done (``row.json``, the CSV row, is written
    last), so a re-run overwrites and a killed run leaves nothing there.
    Returns 2 (nothing written) for an unknown task id or a missing task list.
    """
    out_dir = Path(out_dir).resolve()
    try:
        tasks = json.loads((out_dir / TASKS).read_text())
        task = tasks["tasks"][task_id] if task_id >= 0 else None
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        task = None
    if task is None:
        print(f"error: {out_dir / TASKS} has no task {task_id}", file=sys.stderr)
        return 2
    name, results = task["submission"], out_dir / RESULTS
    attempt = results / f"{ATTEMPT_PREFIX}{task_id}-{os.getpid()}-{secrets.token_hex(4)}"
    attempt.mkdir(parents=True)
    atomic_write(attempt / "attempt.json", json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                                       "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                                       "slurm_job": os.environ.get("SLURM_JOB_ID", "")}) + "\n")
    os.environ.update(tasks.get("env", {}))
    mismatch = secret_mismatch(tasks)
    if mismatch:
        row = {"submission": name, "score": "", "max_score": "", "status": RowStatus.GRADER_ERROR,
               "notes": f"score left blank ({RowStatus.GRADER_ERROR}){NOTE_SEPARATOR}not graded: {mismatch}"}
    else:
        row = grade_one(Path(task["path"]), attempt, tasks["grade_args"], float(tasks["limit_s"]))
        if tasks.get("benchmarks"):
            data, status = _run_benchmarks(task["path"], attempt, float(tasks["benchmark_limit_s"]))
            row.update({"benchmarks_score": f"{float(data.get('score', 0) or 0):g}",
                        "benchmarks_max_score": f"{float(data.get('max_score', 0) or 0):g}",
                        "benchmarks_status": status, **criterion_cells(data)})
    atomic_write(attempt / ROW, json.dumps({"batch": tasks["batch"], "task": task_id, "row": row}, indent=1) + "\n")
    final, old = results / name, results / f"{ATTEMPT_PREFIX}{task_id}-old-{secrets.token_hex(4)}"
    if final.exists():
        os.replace(final, old)
    os.replace(attempt, final)
    for leftover in results.glob(f"{ATTEMPT_PREFIX}{task_id}-*"):     # this one's old result, killed runs
        shutil.rmtree(leftover, ignore_errors=True)
    if row["status"] in UNSCORED:
        print(f"error: task {task_id} {name}: {row['notes']} -> {final}", file=sys.stderr)
        return EXIT_GRADER_ERROR
    print(f"task {task_id} {name}: {row['score']}/{row['max_score']} ({row['status']}) -> {final}")
    return 0


# Merging the array's results: grades.csv, the class report, and the tasks to run again.


@dataclass
class Collected:
    """What ``collect`` found: the merged rows and which tasks need another run (``(id, name, why)``)."""

    rows: list[dict]
    submissions_dir: Path | None = None
    failed: list[tuple[int, str, str]] = field(default_factory=list)
    missing: list[tuple[int, str, str]] = field(default_factory=list)
    resubmit: str = ""                 # the submit command for failed + missing tasks, "" when none

    @property
    def complete(self) -> bool:
        return not self.failed and not self.missing


def _row_of(out_dir: Path, batch: str, name: str) -> dict | None:
    try:
        kept = json.loads((out_dir / RESULTS / name / ROW).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("batch") != batch or not isinstance(kept.get("row"), dict):
        return None
    return kept["row"] if kept["row"].get("submission") == name else None


def _attempt_note(out_dir: Path, task_id: int) -> str:
    """"started on HOST at T" for the latest unfinished attempt of the task, else ""."""
    notes = []
    for attempt in sorted((out_dir / RESULTS).glob(f"{ATTEMPT_PREFIX}{task_id}-*")):
        try:
            info = json.loads((attempt / "attempt.json").read_text())
            notes.append(f"an attempt started on {info.get('host', '?')} at {info.get('started', '?')} "
                         "has no result (killed midway, or still running)")
        except (OSError, ValueError):
            continue
    return notes[-1] if notes else "not run yet (or no result kept)"


def collect(out_dir: Path, out_csv: Path) -> Collected:
    """Merge the finished tasks of the array in ``out_dir`` into ``out_csv`` and its class report.

    Only the ``results/<name>/row.json`` that ``slurm.run_task`` kept for this array count (a row of an earlier
    array in the same folder does not); ``out_csv`` gets the columns and cells ``batch`` would write, with the
    problem columns the array was made for. A task is *failed* when its grader did not finish
    (``batch.UNSCORED``: its score is what it judged, blank when nothing, and its notes say why) and *missing*
    when it kept no result (not run yet, still running, or killed midway). For failed and missing tasks it
    writes ``out_dir/resubmit.sh``, the ``submit.sh --array=<ids>`` that re-runs just those, and removes it when
    none are left. Raises ValueError when ``out_dir`` holds no task list.
    """
    out_dir = Path(out_dir).resolve()
    try:
        tasks = json.loads((out_dir / TASKS).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{out_dir}: no readable {TASKS} (write one with `batch SUBMISSIONS --slurm OUT_DIR`): "
                         f"{exc}") from None
    result = Collected(rows=[], submissions_dir=Path(tasks["submissions_dir"]))
    for task in tasks["tasks"]:
        task_id, name = int(task["id"]), task["submission"]
        row = _row_of(out_dir, tasks["batch"], name)
        if row is None:
            result.missing.append((task_id, name, _attempt_note(out_dir, task_id)))
            continue
        result.rows.append(row)
        if row.get("status") in RERUN_STATUSES:
            result.failed.append((task_id, name, f"{row['status']}: {row.get('notes', '')}"))
    chosen = tasks.get("env", {}).get(PROBLEMS_ENV)
    problems = parse_problems(chosen) if chosen else None
    linked = write_grades(Path(out_csv), result.rows, out_dir / RESULTS, problems)
    results, not_graded = class_report_inputs(result.rows, out_dir / RESULTS)
    for name, data in results.items():          # the benchmark thresholds are criteria of the report too
        bench = out_dir / RESULTS / name / "benchmarks.json"
        try:
            data["tests"] = data["tests"] + list(json.loads(bench.read_text()).get("tests", []))
        except (OSError, ValueError, AttributeError, TypeError):
            pass
    write_class_report(Path(out_csv), results, not_graded, students=linked, problems=problems)
    redo = sorted(t for t, _, _ in result.failed + result.missing)
    resubmit = out_dir / RESUBMIT
    if redo:
        throttle = tasks.get("max_parallel")
        result.resubmit = (f"bash {shlex.quote(str(out_dir / SUBMIT))} "     # the submit step checks the secret
                           f"--array={array_spec(redo, min(throttle, len(redo)) if throttle else None)}")
        atomic_write(resubmit, f"#!/bin/bash\n# re-runs the failed and missing tasks of {out_dir}\n"
                               f"{result.resubmit}\n")
        os.chmod(resubmit, 0o755)
    else:
        resubmit.unlink(missing_ok=True)
    return result


if __name__ == "__main__":         # what submit.sh runs: python -m grading.commands.slurm submit OUT_DIR [sbatch args]
    sys.exit(submit(Path(sys.argv[2]), sys.argv[3:]) if sys.argv[1:2] == ["submit"] and len(sys.argv) > 2 else
             print("usage: python -m grading.commands.slurm submit OUT_DIR [sbatch options]", file=sys.stderr) or 2)
