"""Merge a Slurm array's results: ``python -m grading batch --collect OUT_DIR --out grades.csv``.

``collect`` writes ``grades.csv`` and the class report for the finished tasks, exactly as ``batch`` would, and
sorts out the tasks that need another run.
"""
from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from grading.commands.batch import UNSCORED, class_report_inputs, write_grades
from grading.commands.class_report import write_class_report
from grading.commands.slurm import ATTEMPT_PREFIX, RESULTS, ROW, SUBMIT, TASKS, array_spec
from grading.kit.course import parse_problems
from common.files import atomic_write
from common.settings import PROBLEMS_ENV

RERUN_STATUSES = UNSCORED
RESUBMIT = "resubmit.sh"


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
