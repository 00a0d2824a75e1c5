"""How strong the checks are (staff): ``python -m grading mutants --out report/``.

Every in-region mutant of the reference (``grading.kit.mutations``), or a seeded sample of them, is graded on its
own sub-problem like one submission of a batch (``grade_mutant``): a mutant that loses a point is killed, one that
keeps full marks survived unless staff list it as equivalent. ``run_mutants`` writes the report
(``mutants_report``) and a ledger from which a stopped run goes on.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from grading import KIT_ROOT
from grading.commands.batch import default_limit_s, grade_one, grading_servers
from grading.commands.grades_csv import RowStatus
from grading.commands.result_tests import criterion_id, scored_tests
from common.files import read_jsonl
from grading.commands.mutants_report import grade_folder, listed_equivalents, problem_folder, summary, write_report
from grading.kit.mutations import EQUIVALENTS_FILE, Mutant, mutants_of, sample
from common.regions import student_files
from grading.kit.splice import kit_text

LEDGER = "mutants.jsonl"


def selection(text: str) -> tuple[str, ...]:
    """``"1.2,2"`` -> ("1.2", "2"): problems and sub-problems of this kit (example ones included); ValueError
    naming what is unknown."""
    from grading.problems import titles
    chosen = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    known = set(titles()) | {sub.split(".")[0] for sub in titles()}
    if not chosen or (unknown := [p for p in chosen if p not in known]):
        raise ValueError(f"--problem {text!r}: choose from {', '.join(titles())} or their problems "
                         f"({'unknown ' + ', '.join(unknown) if chosen else 'none given'})")
    return chosen


def fingerprint(mutant: Mutant, root: Path = KIT_ROOT) -> str:
    """What a recorded grade of ``mutant`` depends on: its id and place, the text of its student file, and every
    file of its sub-problem's grader folder (checks, hidden checks, references, data, equivalents)."""
    digest = hashlib.sha256(f"{mutant.id}:{mutant.occurrence}\n".encode())
    digest.update(kit_text(root, mutant.path).encode())
    folder = problem_folder(mutant.problem)
    for file in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        if file.name != EQUIVALENTS_FILE:
            digest.update(file.relative_to(folder).as_posix().encode() + file.read_bytes())
    return digest.hexdigest()[:16]


def verdict(status: str, tests: list[dict]) -> str:
    """``killed`` (a criterion lost points, or the grade ran out of time), ``survived`` (full marks) or
    ``error`` (the grader refused the mutant or failed itself: no verdict on the checks)."""
    lost = any(float(t["score"]) < float(t["max_score"]) for t in tests)
    if status in (RowStatus.FAILED, RowStatus.TIMEOUT, RowStatus.INCOMPLETE) or lost:
        return "killed"
    return "survived" if status == RowStatus.PASSED and tests else "error"


def grade_mutant(mutant: Mutant, out: Path, limit_s: float, env: dict[str, str], root: Path = KIT_ROOT) -> dict:
    """Grade ``mutant`` on its sub-problem as a submission that holds every student file of the kit, the mutated
    one changed; return its record: id, verdict, status, seconds, the criteria it ``passed`` and ``failed``
    (criterion ids), its ``fingerprint`` and, for a survivor, its ``diff``."""
    before = fingerprint(mutant, root)            # what this grade ran on, taken before it starts
    folder = grade_folder(out, mutant.id)
    submission = folder / "submission"
    shutil.rmtree(submission, ignore_errors=True)
    for rel in student_files(root):
        target = submission / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(mutant.text(root) if rel == mutant.path else kit_text(root, rel))
    try:
        row = grade_one(submission, folder, ["--problem", mutant.problem], limit_s, env)
    finally:
        shutil.rmtree(submission, ignore_errors=True)
    try:
        data = json.loads((folder / "results.json").read_text())
    except (OSError, ValueError):
        data = {}
    tests = [t for t in scored_tests(data) if str(t.get("number", "")) == mutant.problem]
    record = {"id": mutant.id, "verdict": verdict(str(row["status"]), tests), "status": row["status"],
              "seconds": float(row.get("seconds") or 0.0), "fingerprint": before,
              "passed": [criterion_id(t) for t in tests if float(t["score"]) >= float(t["max_score"])],
              "failed": [criterion_id(t) for t in tests if float(t["score"]) < float(t["max_score"])],
              "notes": row.get("notes", "")}
    return {**record, "diff": mutant.diff(root)} if record["verdict"] != "killed" else record


def earlier_records(out: Path, mutants: list[Mutant]) -> dict[str, dict]:
    """id -> the record ``out``'s ledger kept for each of ``mutants`` whose fingerprint is unchanged."""
    records, _ = read_jsonl(Path(out) / LEDGER) if (Path(out) / LEDGER).is_file() else ([], [])
    current = {m.id: fingerprint(m) for m in mutants}
    return {r["id"]: r for r in records if isinstance(r, dict) and current.get(r.get("id")) == r.get("fingerprint")}


def run_mutants(out: Path, problems: tuple[str, ...] | None = None, per_problem: int | None = None, seed: int = 0,
                jobs: int = 1, limit_s: float | None = None, fresh: bool = False,
                progress: Callable[[str], None] | None = None) -> dict:
    """Grade the mutants of ``problems`` (default all; ``per_problem``: a sample of that many per sub-problem,
    drawn with ``seed``), ``jobs`` at a time, each within ``limit_s`` (default: its sub-problem's grade limit,
    ``batch.default_limit_s``); write the report into ``out`` and return it (``mutants_report.summary``).

    Grades recorded in ``out`` by an earlier run whose fingerprint still holds are kept, not graded again,
    unless ``fresh``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    every = mutants_of(KIT_ROOT, problems)
    chosen = sample(every, per_problem, seed) if per_problem is not None else every
    if fresh:
        (out / LEDGER).unlink(missing_ok=True)
    records = earlier_records(out, chosen)
    todo = [m for m in chosen if m.id not in records]
    listed = {e.mutant for problem in {m.problem for m in chosen} for e in listed_equivalents(problem)}
    lock, start = threading.Lock(), time.monotonic()

    def one(mutant: Mutant) -> None:
        limit = limit_s if limit_s is not None else default_limit_s(["--problem", mutant.problem])
        record = grade_mutant(mutant, out, limit, env)
        with lock:
            records[mutant.id] = record
            with open(out / LEDGER, "a") as ledger:
                ledger.write(json.dumps(record) + "\n")
            if progress:
                failed = f" ({', '.join(record['failed'][:3])})" if record["failed"] else ""
                shown = "equivalent (listed)" if record["verdict"] == "survived" and mutant.id in listed else \
                    record["verdict"]
                progress(f"[{len(records)}/{len(chosen)}] {mutant.id}: {shown}{failed} "
                         f"in {record['seconds']:.1f} s")

    if progress and len(todo) < len(chosen):
        progress(f"{len(chosen) - len(todo)} of {len(chosen)} mutants kept from {out / LEDGER}")
    with grading_servers() as env, ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, todo))
    report = summary(chosen, every, [records[m.id] for m in chosen],
                     {"seconds": round(time.monotonic() - start, 1), "jobs": jobs, "sample": per_problem,
                      "seed": seed if per_problem is not None else None})
    write_report(out, report)
    return report

