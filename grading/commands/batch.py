"""Grade a folder of submissions: ``python -m grading batch SUBMISSIONS_DIR --out grades.csv [--jobs N]``.

Each entry (a folder or a ``.zip``; hidden names are skipped) gets its own ``python -m grading grade`` process
with a wall-clock limit (``grade_one``), which has one of the batch's warm fork servers (``grading_servers``) fork
the grade itself (``grading.__main__.main_warm``; cold under ``GRADING_FORKSERVER=0``): no grade imports the
libraries again, nothing of one grade reaches the next, and one that crashes, hangs or is killed costs only its
own row. The CSV (columns: docs/grading-a-class.md) is rewritten after each grade; the class report
follows at the end.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from grading.commands.benchmarks import NOT_SCORED
from grading.commands.class_report import write_class_report
from grading.commands.csv_cells import write_csv
from grading.commands.grades_csv import (HEAD, RowStatus, columns_of, criterion_cells, is_criterion_column,
                                         problem_columns)
from grading.commands.result_tests import is_not_graded, judged_tests, verdict
from grading.engine.runner import warm_servers
from grading.commands import report, results_json
from grading.commands.report import EXIT_FAIL, EXIT_GRADER_ERROR, EXIT_INCOMPLETE, EXIT_PASS, EXIT_USAGE
from grading.engine.rubric import selects
from grading.engine.runner import out_of_time
from common import ROOT
from common.startup import GRADE_IMPORTS
from grading.problems import all_cases
from grading.problems import titles

STATUS = {EXIT_PASS: RowStatus.PASSED, EXIT_FAIL: RowStatus.FAILED, EXIT_USAGE: RowStatus.REJECTED,
          EXIT_INCOMPLETE: RowStatus.INCOMPLETE, EXIT_GRADER_ERROR: RowStatus.GRADER_ERROR}
SCRATCH_PREFIX = "grading-grade-"      # each grade's temporary folder (its TMPDIR), removed when it ends
GRADED = (RowStatus.PASSED, RowStatus.FAILED, RowStatus.INCOMPLETE,      # statuses whose criteria count
          RowStatus.GRADER_ERROR)                                         # (not rejected, timeout)
UNSCORED = (RowStatus.TIMEOUT, RowStatus.GRADER_ERROR)     # the grade did not finish: its partial score, blank if it
                                                           # judged nothing
                                           # (``result_tests.verdict``)
NOTE_SEPARATOR = " | "


def submissions_in(folder: Path) -> list[Path]:
    """The gradable entries of ``folder`` (folders and .zip files, not hidden), sorted by name."""
    return sorted(p for p in Path(folder).iterdir()
                  if not p.name.startswith(".") and (p.is_dir() or p.suffix.lower() == ".zip"))


def default_limit_s(grade_args: list[str]) -> float:
    """A wall-clock limit for one whole ``grade`` run: the limits of the cases it runs (those of ``--problem``,
    each ``--timeout`` when given), plus start-up slack."""
    def option(name: str) -> str | None:
        return grade_args[grade_args.index(name) + 1] if name in grade_args[:-1] else None
    timeout, problem = option("--timeout"), option("--problem")
    cases = [c for c in all_cases() if any(selects(problem, x.problem) for x in c.criteria)]
    return sum(float(timeout) if timeout is not None else c.timeout_s for c in cases) + 30.0 * len(cases) + 60.0


@contextmanager
def grading_servers() -> Iterator[dict[str, str]]:
    """Fork servers that many ``grade_one`` calls share, preloaded with what a grade's own judging imports, so no
    grade imports the libraries again; yields the ``env`` to pass to each (empty where fork servers are off) and
    closes the servers when the block ends."""
    servers = warm_servers(ROOT)
    if servers is None:
        yield {}
        return
    try:
        servers.preload(servers.servers, GRADE_IMPORTS)
        yield servers.pool_env()
    finally:
        servers.close()


def grade_one(entry: Path, out: Path, grade_args: list[str], limit_s: float, env: dict[str, str] | None = None
              ) -> dict:
    """Grade ``entry`` in a child ``python -m grading grade`` (with ``env`` added to this process's environment:
    ``run_batch`` names its fork servers there) into folder ``out``; return its CSV row.

    The grader, its ranks and whatever they start get a temporary folder of their own (``TMPDIR``, a new
    ``grading-grade-*`` folder in this process's), removed when the grade ends, however it ends: a grader
    killed by its submission or at its limit leaves nothing behind (its copy of the kit, its runs).
    Never raises for anything the submission or its grader does; when this process is stopped
    (SIGTERM, ^C) the child grader is stopped too before the exception goes on.
    """
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.json"
    results.unlink(missing_ok=True)
    command = ["grade", str(entry.resolve()), "--json", str(results), "--quiet", "--total-timeout", f"{limit_s:g}",
               *grade_args]
    start = time.monotonic()
    code: int | None = None
    not_started = ""            # why the grader could not be started at all
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
    try:
        with open(out / "report.txt", "wb") as stdout, open(out / "stderr.txt", "wb") as stderr:
            try:
                proc = subprocess.Popen([sys.executable, "-m", "grading", *command], cwd=ROOT,
                                        env={**os.environ, **(env or {}), "TMPDIR": str(scratch)},
                                        stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, start_new_session=True)
                try:
                    code = proc.wait(timeout=limit_s)
                except subprocess.TimeoutExpired:
                    _kill(proc, signal.SIGKILL)
                except BaseException:    # SIGTERM (scancel, a Slurm time limit), ^C: the grader stops its ranks too
                    _kill(proc, signal.SIGTERM, grace_s=15.0)
                    raise
            except OSError as exc:
                not_started = f"cannot start the grader: {exc}"
                stderr.write(f"{not_started}\n".encode())
    finally:
        _remove(scratch)
    return finished_row(entry.name, out, code, not_started, limit_s, time.monotonic() - start)


def finished_row(name: str, out: Path, code: int | None, not_started: str, limit_s: float, seconds: float) -> dict:
    """The grades.csv row of the grade of ``name`` into folder ``out`` that ended with ``code`` (None: killed at
    ``limit_s``) after ``seconds``. A grade stopped before its end gets its results.json finished (``_verdict``)
    and the end of its table appended to ``report.txt`` (``report.stopped_lines``): one verdict in all three."""
    status, data, stopped = _verdict(out / "results.json", code, not_started, limit_s)
    if stopped:         # the grade wrote no table's end: the same verdict as its results.json and this row
        with open(out / "report.txt", "a") as table:
            table.write("\n".join(report.stopped_lines(data, stopped, status)) + "\n")
    return row_of(name, status, data, code, seconds)


def row_of(name: str, status: RowStatus, data: dict, code: int | None, seconds: float) -> dict:
    """The grades.csv row of a grade that ended with ``status`` and left the results.json ``data``: its score,
    problem and criterion cells and the first note are ``result_tests.verdict``'s (the points of the criteria it
    judged, blank when none), as its results.json, report.txt and the class report state them."""
    found = verdict(data)
    judged = judged_tests(data)["tests"]
    by_problem: dict[str, float] = {}
    for test in (t for t in judged if str(t.get("number", "")) in titles()):
        by_problem[str(test["number"])] = by_problem.get(str(test["number"]), 0.0) + float(test.get("score", 0.0))
    extra = data.get("extra_data")
    hits = extra.get(results_json.HIT_LIMIT, []) if isinstance(extra, dict) else []
    notes = NOTE_SEPARATOR.join(n for n in (found.marker(status), notes_of(str(data.get("output", ""))),
                                            *map(str, hits)) if n)
    return {"submission": name, "score": "" if found.score is None else f"{found.score:g}",
            "max_score": f"{found.max_score:g}" if found.listed else "", "status": status,
            "exit_code": "" if code is None else code, "seconds": f"{seconds:.1f}",
            **{c: "" if c[len("problem_"):] not in by_problem else f"{by_problem[c[len('problem_'):]]:g}"
               for c in problem_columns()},
            "notes": notes, **(criterion_cells(data) if status != RowStatus.REJECTED else {})}


def _verdict(results: Path, code: int | None, not_started: str, limit_s: float) -> tuple[RowStatus, dict, str]:
    """(row status, results.json data, why the grade stopped: "" when it ended by itself) of a grade that ended
    with ``code`` (None: killed at ``limit_s``).

    A partial report left by a grade stopped midway is finished (``results_json.finish``) with why; without one, a
    report with no tests says why. A grade that finished with criteria not graded (its total) is a ``timeout``.
    """
    data = _load(results)
    unfinished = data is not None and results_json.UNFINISHED in (data.get("extra_data") or {})
    data = None if data is not None and data.get("output") == results_json.PLACEHOLDER else data
    if not_started:
        status, why = RowStatus.GRADER_ERROR, not_started
    elif code is None:
        status, why = RowStatus.TIMEOUT, out_of_time(limit_s)
    elif unfinished or data is None:
        status = RowStatus.GRADER_ERROR
        why = f"the grader did not finish ({f'stopped by signal {-code}' if code < 0 else f'exit code {code}'})"
    else:
        status = (RowStatus.TIMEOUT if any(is_not_graded(t) for t in data["tests"])
                  else STATUS.get(code, RowStatus.GRADER_ERROR))
        return status, data, ""
    if (kept := results_json.finish(results, why) if unfinished else None) is None:
        results_json.write_json(results, [], [why])
        kept = _load(results) or {"output": why, "tests": []}
    return status, kept, why


def progress_line(row: dict, done: int, total: int) -> str:
    """A batch progress line: the row's score (what it judged, or "no score") and status, with the first note
    that says why for a grade that did not finish."""
    score = "no score" if row.get("score", "") == "" else f"{row['score']}/{row['max_score']}"
    why = [n for n in str(row.get("notes", "")).split(NOTE_SEPARATOR) if n and "score" not in n[:16]][:1]
    why = f": {why[0]}" if why and row.get("status") in UNSCORED else ""
    return f"[{done}/{total}] {row['submission']}: {score} ({row['status']}{why}) in {row.get('seconds') or '?'} s"


def notes_of(output: str, own: str = "") -> str:
    """grades.csv's notes: ``own`` (batch's note) and one entry per issue the grade reported in ``output`` (its
    results.json's top-level text), each once, joined by ``NOTE_SEPARATOR``.

    The figures lines (``benchmarks.NOT_SCORED``, in every grade's report) are no issue and are left out; a
    grader error's traceback becomes one entry, ``grader error: <its last line>``.
    """
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    entries = [own] if own else []
    for k, line in enumerate(lines):
        if line.startswith("grader error"):
            entries.append(f"grader error: {lines[-1][:200]}" if k + 1 < len(lines) else line[:200])
            break
        if not line.startswith(NOT_SCORED):
            entries.append(line[:200])
    return NOTE_SEPARATOR.join(dict.fromkeys(entries))


def _kill(proc: subprocess.Popen, sig: int, grace_s: float = 0.0) -> None:
    """Send ``sig`` to the grader's session; after ``grace_s`` seconds without an exit, SIGKILL it."""
    for current in (sig, signal.SIGKILL):
        try:
            os.killpg(proc.pid, current)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=grace_s if current != signal.SIGKILL else None)
            return
        except subprocess.TimeoutExpired:
            continue


def _remove(folder: Path, tries: int = 20) -> None:
    """Remove ``folder``; a killed grader's ranks may still be ending (their fork servers kill them once the
    grader is gone) and writing there, so try again for a few seconds."""
    for _ in range(tries):
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            return
        time.sleep(0.25)


def _load(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("tests"), list) else None


def with_links(rows: list[dict], out_csv: Path, results_dir: Path) -> list[dict]:
    """``rows`` sorted by name, each with ``results``: the path of its ``results.json`` relative to ``out_csv``'s
    folder (empty when there is none), as the CSV and the class report page link it."""
    linked = []
    for row in sorted(rows, key=lambda row: row["submission"]):
        target = Path(results_dir) / row["submission"] / "results.json"
        link = Path(os.path.relpath(target.resolve(), Path(out_csv).resolve().parent)).as_posix()
        linked.append({**row, "results": link if target.is_file() else ""})
    return linked


def write_grades(out_csv: Path, rows: list[dict], results_dir: Path, problems: tuple[str, ...] | None = None
                 ) -> list[dict]:
    """Write grades.csv (``columns_of(rows, problems)``, rows ``with_links``); return the rows as written."""
    linked = with_links(rows, out_csv, results_dir)
    write_csv(out_csv, columns_of(linked, problems), linked)
    return linked


def load_results(results_dir: Path, names: list[str]) -> dict[str, dict]:
    """name -> the results.json data kept in ``results_dir/<name>/`` (names without one are left out)."""
    found = {name: _load(Path(results_dir) / name / "results.json") for name in names}
    return {name: data for name, data in found.items() if data is not None}


def class_report_inputs(rows: list[dict], results_dir: Path) -> tuple[dict[str, dict], dict[str, str]]:
    """(name -> results.json data, name -> status) of the rows that count in the class report and of the others.

    A row counts when its grader judged something (it has a criterion cell): a graded one, or one that did not
    finish (``UNSCORED``) with its partial score; the class report counts the criteria it judged.
    """
    counted = {row["submission"] for row in rows
               if row.get("status") in GRADED + UNSCORED and any(is_criterion_column(k) for k in row)}
    return load_results(results_dir, sorted(counted)), {row["submission"]: str(row.get("status", ""))
                                                         for row in rows if row["submission"] not in counted}


def run_batch(submissions_dir: Path, out_csv: Path, jobs: int = 1, grade_args: list[str] | None = None,
              results_dir: Path | None = None, limit_s: float | None = None,
              progress: Callable[[str], None] | None = None) -> list[dict]:
    """Grade every entry of ``submissions_dir``, ``jobs`` at a time; write ``out_csv``; return the rows.

    ``grade_args`` are passed to each ``grade`` (e.g. ``["--problem", "1"]``);
    ``results_dir`` defaults to ``<out_csv stem>_results`` next to the CSV;
    ``limit_s`` bounds each submission (default: ``default_limit_s``). The class
    report (``class_report.write_class_report``) is written next to ``out_csv`` at the end.
    """
    grade_args = list(grade_args or [])
    out_csv = Path(out_csv)
    results_dir = Path(results_dir) if results_dir else out_csv.with_name(out_csv.stem + "_results")
    limit_s = limit_s if limit_s is not None else default_limit_s(grade_args)
    entries = submissions_in(submissions_dir)
    rows: list[dict] = []
    lock = threading.Lock()

    def one(entry: Path) -> None:
        try:
            row = grade_one(entry, results_dir / entry.name, grade_args, limit_s, pool_env)
        except Exception as exc:  # noqa: BLE001 - a batch never stops for one submission
            row = {column: "" for column in HEAD}
            row.update(submission=entry.name, status=RowStatus.GRADER_ERROR,
                       notes=f"score left blank ({RowStatus.GRADER_ERROR}){NOTE_SEPARATOR}"
                             f"batch error: {type(exc).__name__}: {exc}")
        with lock:
            rows.append(row)
            write_grades(out_csv, rows, results_dir)
            if progress:
                progress(progress_line(row, len(rows), len(entries)))

    write_grades(out_csv, rows, results_dir)
    with grading_servers() as pool_env, ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, entries))
    linked = write_grades(out_csv, rows, results_dir)
    write_class_report(out_csv, *class_report_inputs(rows, results_dir), students=linked)
    return sorted(rows, key=lambda row: row["submission"])
