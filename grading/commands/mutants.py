"""How strong the checks are (staff): ``python -m grading mutants --out report/``.

Every in-region mutant of the reference (``grading.kit.mutations``), or a seeded sample of them, is graded on its
own sub-problem like one submission of a batch (``grade_mutant``): a mutant that loses a point is killed, one that
keeps full marks survived unless staff list it as equivalent. ``run_mutants`` keeps a ledger from which a stopped
run goes on and writes the report (``summary``): per sub-problem its mutation score, killed / (mutants − listed
equivalents), then what staff must act on. Survivors come with their diff and the criteria they passed; a listed
equivalent that the checks now kill, or that no longer applies (``mutations.stale``), is flagged; a grade that gave
no verdict is an error and lowers the score. Written as ``mutants.json`` and ``mutants.html``
(``templates/mutants.html``, every piece of text HTML-escaped).
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

from common import ROOT
from grading.commands.batch import default_limit_s, grade_one, grading_servers
from grading.commands.grades_csv import RowStatus
from grading.commands.result_tests import criterion_id, scored_tests
from grading.commands.templates import render as render_template
from common.files import atomic_write, read_jsonl
from grading.kit.mutations import EQUIVALENTS_FILE, Equivalent, Mutant, equivalents, mutants_of, sample, stale
from grading.problems import folders, titles
from common.regions import student_files
from grading.kit.splice import kit_text

LEDGER = "mutants.jsonl"
JSON_NAME, HTML_NAME = "mutants.json", "mutants.html"
GRADES = "grades"          # <out>/grades/<mutant>/: that grade's results.json, report.txt, stderr.txt


# Where things are: a mutant's grade, a sub-problem's grader folder and the equivalents staff listed there.


def grade_folder(out: Path, mutant_id: str) -> Path:
    """Where the grade of mutant ``mutant_id`` ("1.2/f/Op/3") is kept under a run's ``out`` folder."""
    return Path(out) / GRADES / mutant_id.replace("/", "__")


def problem_folder(problem: str) -> Path:
    """The grader folder of sub-problem ``problem`` ("2.1"): checks, hidden checks, data, equivalents."""
    return Path(folders()[problem].__file__).parent


def listed_equivalents(problem: str) -> list[Equivalent]:
    """The mutants staff listed as equivalent in ``problem``'s folder (``mutations.equivalents``)."""
    return equivalents(problem_folder(problem) / EQUIVALENTS_FILE, problem)


# Grading the mutants.


def selection(text: str) -> tuple[str, ...]:
    """``"1.2,2"`` -> ("1.2", "2"): problems and sub-problems of this kit (example ones included); ValueError
    naming what is unknown."""
    chosen = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    known = set(titles()) | {sub.split(".")[0] for sub in titles()}
    if not chosen or (unknown := [p for p in chosen if p not in known]):
        raise ValueError(f"--problem {text!r}: choose from {', '.join(titles())} or their problems "
                         f"({'unknown ' + ', '.join(unknown) if chosen else 'none given'})")
    return chosen


def fingerprint(mutant: Mutant, root: Path = ROOT) -> str:
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
    lost_points = any(float(t["score"]) < float(t["max_score"]) for t in tests)
    if status in (RowStatus.FAILED, RowStatus.TIMEOUT, RowStatus.INCOMPLETE) or lost_points:
        return "killed"
    return "survived" if status == RowStatus.PASSED and tests else "error"


def grade_mutant(mutant: Mutant, out: Path, limit_s: float, env: dict[str, str], root: Path = ROOT) -> dict:
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
    ``batch.default_limit_s``); write the report into ``out`` and return it (``summary``).

    Grades recorded in ``out`` by an earlier run whose fingerprint still holds are kept, not graded again,
    unless ``fresh``.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    every = mutants_of(ROOT, problems)
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


# The report.


def summary(chosen: list[Mutant], every: list[Mutant], records: list[dict], run: dict) -> dict:
    """The report of the graded ``chosen`` mutants (``records`` in the same order; ``every``: all mutants of their
    sub-problems, against which listed equivalents are checked) with ``run``'s facts (seconds, jobs, sample,
    seed). ``complete`` is true when every sub-problem scores 100 % with no error and no flagged equivalent."""
    problems = sorted({m.problem for m in every}, key=lambda p: [int(x) for x in p.split(".")])
    listed = {p: {e.mutant: e for e in listed_equivalents(p)} for p in problems}
    per: dict[str, dict] = {p: {"mutants": 0, "killed": 0, "survived": 0, "equivalent": 0, "errors": 0}
                            for p in problems}
    report: dict = {**run, "grade_seconds": round(sum(r["seconds"] for r in records), 1), "mutants": len(chosen),
                    "problems": per, "survivors": [], "equivalent": [], "equivalent_killed": [], "errors": [],
                    "stale": [{"problem": p, "mutant": e.mutant, "line": e.line, "reason": e.reason}
                              for p in problems
                              for e in stale(list(listed[p].values()), [m for m in every if m.problem == p])]}
    for mutant, record in zip(chosen, records):
        counts, equivalent = per[mutant.problem], listed[mutant.problem].get(mutant.id)
        counts["mutants"] += 1
        where = {"id": mutant.id, "problem": mutant.problem, "path": mutant.path, "line": mutant.line,
                 "operator": mutant.operator}
        if record["verdict"] == "killed":
            counts["killed"] += 1
            if equivalent is not None:
                report["equivalent_killed"].append({**where, "reason": equivalent.reason, "failed": record["failed"]})
        elif record["verdict"] == "survived" and equivalent is not None:
            counts["equivalent"] += 1
            report["equivalent"].append({**where, "reason": equivalent.reason, "diff": record.get("diff", "")})
        elif record["verdict"] == "survived":
            counts["survived"] += 1
            report["survivors"].append({**where, "diff": record.get("diff", ""), "passed": record["passed"]})
        else:
            counts["errors"] += 1
            report["errors"].append({**where, "status": record["status"], "notes": record.get("notes", "")})
    for counts in per.values():
        judged = counts["mutants"] - counts["equivalent"]
        counts["score"] = round(counts["killed"] / judged, 4) if judged else None
    report["complete"] = not (report["survivors"] or report["errors"] or report["stale"]
                              or report["equivalent_killed"])
    return report


def table(report: dict) -> list[str]:
    """The report as terminal lines: one per sub-problem, then one per survivor, flag and error."""
    lines = [f"{'sub-problem':<12}{'mutants':>8}{'killed':>8}{'survived':>9}{'equiv.':>7}{'errors':>7}  score"]
    for problem, c in report["problems"].items():
        lines.append(f"{problem:<12}{c['mutants']:>8}{c['killed']:>8}{c['survived']:>9}{c['equivalent']:>7}"
                     f"{c['errors']:>7}  {_score(c)}")
    lines += [f"survived: {s['id']} ({s['path']}:{s['line']}), passed {', '.join(s['passed'])}"
              for s in report["survivors"]]
    lines += [f"listed as equivalent, but killed: {e['id']} (by {', '.join(e['failed'])})"
              for e in report["equivalent_killed"]]
    lines += [f"listed as equivalent, no longer applies: {e['mutant']} ({e['line']})" for e in report["stale"]]
    lines += [f"no verdict ({e['status']}): {e['id']}: {e['notes'][:160]}" for e in report["errors"]]
    sample = f", a sample of {report['sample']} per sub-problem (seed {report['seed']})" if report["sample"] else ""
    mutants = f"{report['mutants']} mutant{'' if report['mutants'] == 1 else 's'}"
    lines.append(f"{mutants}{sample}: {report['seconds']:g} s here ({report['jobs']} at a time), "
                 f"{report['grade_seconds']:g} s of grades in all")
    return lines


def write_report(out: Path, report: dict) -> None:
    """Write ``out``/``JSON_NAME`` and ``out``/``HTML_NAME``."""
    atomic_write(Path(out) / JSON_NAME, json.dumps(report, indent=1) + "\n")
    atomic_write(Path(out) / HTML_NAME, page(report, out))


def _score(counts: dict) -> str:
    return "-" if counts["score"] is None else f"{100 * counts['score']:.1f} %"


def page(report: dict, out: Path | None = None) -> str:
    """The report as one static HTML page (``templates/mutants.html``), written into ``out``: each mutant links to
    the report and results of its grade (``grade_folder``) where ``out`` holds them; a section with nothing in it
    says so in one line."""
    def mutant(mutant_id: str) -> dict:
        """The mutant's id, with the links (relative to ``out``) to its grade's files that are there."""
        if out is None:
            return {"id": mutant_id, "links": []}
        folder = grade_folder(out, mutant_id)
        return {"id": mutant_id, "links": [(folder.relative_to(out).as_posix() + "/" + name, name)
                                           for name in ("report.txt", "results.json") if (folder / name).is_file()]}

    return render_template(
        "mutants.html", summary_line=table(report)[-1],
        scores=[(p, c["mutants"], c["killed"], c["survived"], c["equivalent"], c["errors"], _score(c))
                for p, c in report["problems"].items()],
        survivors=[{"mutant": mutant(s["id"]), "passed": s["passed"], "diff": s["diff"]} for s in report["survivors"]],
        need_a_look=[{"mutant": mutant(x["id"]), "why": f"killed by {', '.join(x['failed'])}"}
                     for x in report["equivalent_killed"]]
        + [{"mutant": {"id": x["mutant"], "links": []}, "why": "no longer applies"} for x in report["stale"]],
        errors=[{"mutant": mutant(x["id"]), "status": x["status"], "notes": x["notes"]} for x in report["errors"]],
        equivalent=[{"mutant": mutant(x["id"]), "reason": x["reason"], "diff": x["diff"]}
                    for x in report["equivalent"]])
