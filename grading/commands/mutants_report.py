"""The report of a ``mutants`` run: per sub-problem its mutation score, then what staff must act on.

The score is killed / (mutants − listed equivalents). Survivors come with
their diff and the criteria they passed; a listed equivalent that the checks
now kill, or that no longer applies (``mutations.stale``), is flagged; a
grade that gave no verdict is an error and lowers the score. Written as
``mutants.json`` and ``mutants.html`` (``templates/mutants.html``, every piece of text HTML-escaped).
"""
from __future__ import annotations

import json
from pathlib import Path

from common.files import atomic_write
from grading.commands.templates import render as render_template
from grading.kit.mutations import EQUIVALENTS_FILE, Equivalent, Mutant, equivalents, stale
from grading.problems import folders

JSON_NAME, HTML_NAME = "mutants.json", "mutants.html"
GRADES = "grades"          # <out>/grades/<mutant>/: that grade's results.json, report.txt, stderr.txt


def grade_folder(out: Path, mutant_id: str) -> Path:
    """Where the grade of mutant ``mutant_id`` ("1.2/f/Op/3") is kept under a run's ``out`` folder."""
    return Path(out) / GRADES / mutant_id.replace("/", "__")


def problem_folder(problem: str) -> Path:
    """The grader folder of sub-problem ``problem`` ("2.1"): checks, hidden checks, data, equivalents."""
    return Path(folders()[problem].__file__).parent


def listed_equivalents(problem: str) -> list[Equivalent]:
    """The mutants staff listed as equivalent in ``problem``'s folder (``mutations.equivalents``)."""
    return equivalents(problem_folder(problem) / EQUIVALENTS_FILE, problem)


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
