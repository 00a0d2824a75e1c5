"""``python -m grading batch``: many submissions, good and bad, one CSV row each; none stops the batch."""
import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import psutil
import pytest

from grading.__main__ import main as grading_main
from grading.commands import batch, grades_csv
from grading.commands.benchmarks import NOT_SCORED
from grading.kit.course import chosen_problems
from common import ROOT
from common.regions import parse_regions
from grading.kit.splice import replace_bodies, stub_body
from grading.kit.variants import make_variant_kit

pytestmark = pytest.mark.kit
DATASET = "data_parallel/dataset.py"


def _starter_text(rel: str) -> str:
    text = (ROOT / rel).read_text()
    return replace_bodies(text, rel, {k: stub_body(r) for k, r in enumerate(parse_regions(text, rel))})


def _folder(root, text: str):
    (root / "data_parallel").mkdir(parents=True)
    (root / DATASET).write_text(text)


def test_batch_grades_everything_and_survives_bad_submissions(tmp_path):
    subs = tmp_path / "submissions"
    _folder(subs / "alice", (ROOT / DATASET).read_text())                 # reference: full marks
    with zipfile.ZipFile(subs / "bob.zip", "w") as z:                         # starter, wrapped in a folder
        z.writestr(f"a5/{DATASET}", _starter_text(DATASET))
    with zipfile.ZipFile(subs / "carol.zip", "w") as z:                       # zip slip: rejected
        z.writestr("../../escape.py", "x = 1")
    hang = make_variant_kit(tmp_path / "k1", [(DATASET, "partition_indices",
                                               "import time\nwhile True:\n    time.sleep(0.1)\n")])
    _folder(subs / "dave", (hang / DATASET).read_text())                      # hangs: cut off per case
    kill_my_grader = ("import os, signal, time\n"
                      "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
                      "    try:\n        line = open(f'/proc/{pid}/cmdline', 'rb').read()\n"
                      "    except OSError:\n        continue\n"
                      "    if b'\\x00grade\\x00' in line and b'/submissions/eve\\x00' in line:\n"
                      "        os.kill(int(pid), signal.SIGKILL)\n"   # its own grader, by command line: not in its view
                      "while True:\n    time.sleep(0.1)\n")
    killer = make_variant_kit(tmp_path / "k2", [(DATASET, "partition_indices", kill_my_grader)])
    _folder(subs / "eve", (killer / DATASET).read_text())             # tries to kill its grader; the test does
    eve_tmp: set[Path] = set()
    stop = threading.Event()

    def kill_eves_grader() -> None:      # as the container's memory limit would: from outside, mid-grade
        while not stop.wait(0.1):
            for process in psutil.process_iter():
                with contextlib.suppress(psutil.Error, KeyError):
                    line = process.cmdline()
                    if "grade" in line and str(subs / "eve") in line:
                        eve_tmp.add(Path(process.environ()["TMPDIR"]))
                        process.kill()
                        return
    killer_thread = threading.Thread(target=kill_eves_grader, daemon=True)
    killer_thread.start()
    parent_killer = make_variant_kit(tmp_path / "k3", [(DATASET, "partition_indices",
                                                        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n")])
    _folder(subs / "frank", (parent_killer / DATASET).read_text())            # signals its parent: out of reach
    (subs / ".DS_Store").write_text("ignored")
    out = tmp_path / "grades.csv"
    try:
        code = grading_main(["batch", str(subs), "--out", str(out), "--jobs", "2", "--problem", "1.1", "--timeout",
                             "6", "--quiet"])
    finally:
        stop.set()
    assert code == 0
    rows = {row["submission"]: row for row in csv.DictReader(out.open())}
    assert list(rows) == ["alice", "bob.zip", "carol.zip", "dave", "eve", "frank"]
    expected = {"alice": ("passed", "13"), "bob.zip": ("incomplete", "0"), "carol.zip": ("rejected", "0"),
                "dave": ("failed", "0"), "eve": ("grader_error", ""), "frank": ("failed", "0")}
    assert {name: (row["status"], row["score"]) for name, row in rows.items()} == expected, rows
    assert rows["alice"]["problem_1.1"] == "13" and rows["alice"]["max_score"] == "13"
    assert "unsafe path" in rows["carol.zip"]["notes"]
    # a grader that did not finish leaves a blank score (never 0) and says why; notes hold each issue once, and
    # the figures lines every grade prints are no issue
    assert "score left blank (grader_error)" in rows["eve"]["notes"] and "did not finish" in rows["eve"]["notes"]
    assert rows["eve"]["problem_1.1"] == "" and rows["eve"]["max_score"] in ("", "13")    # killed before or after
    eve_table = (tmp_path / "grades_results" / "eve" / "report.txt").read_text()            # it listed its criteria
    assert eve_table.rstrip().endswith("TOTAL score left blank: no check was graded"), eve_table
    for row in rows.values():
        entries = row["notes"].split(batch.NOTE_SEPARATOR) if row["notes"] else []
        assert len(entries) == len(set(entries)) and not any("figures" in e for e in entries), row["notes"]
    # columns for the chosen problems only; each row links its results.json (relative to the CSV's folder)
    header = next(csv.reader(out.open()))
    assert [c for c in header if c.startswith("problem_")] == grades_csv.problem_columns(chosen_problems())
    assert all(c.split("_")[1][0] in chosen_problems() for c in header if c.startswith("problem_"))
    assert rows["alice"]["results"] == "grades_results/alice/results.json" and rows["eve"]["results"]
    # eve's grader had a temporary folder of its own (the grading copy and runs went there), and it is gone
    # although the grader was killed before it could clean up
    assert len(eve_tmp) == 1 and all(p.name.startswith(batch.SCRATCH_PREFIX) and not p.exists() for p in eve_tmp), \
        eve_tmp
    # the rank's fork server is outside its PID namespace: a rank that signals "its parent" reaches no process of
    # the grader's, so only its own criteria fail
    frank = json.loads((tmp_path / "grades_results" / "frank" / "results.json").read_text())
    assert not any("a fork server) ended during the run" in t["output"] for t in frank["tests"]), frank
    assert frank["score"] == 0 and all(t["status"] == "failed" for t in frank["tests"]), frank
    for name, row in rows.items():      # one verdict: the same score (or blank) in results.json and grades.csv
        results = json.loads((tmp_path / "grades_results" / name / "results.json").read_text())
        assert "tests" in results and (f"{results['score']:g}" if "score" in results else "") == row["score"], name
    dave = json.loads((tmp_path / "grades_results" / "dave" / "results.json").read_text())
    assert all("timed out after" in t["output"] for t in dave["tests"]), dave
    # one column per criterion (empty where nothing was graded), and the class report next to the CSV
    assert rows["alice"]["1.1.coverage"] == "2" and rows["bob.zip"]["1.1.coverage"] == "0"
    assert rows["carol.zip"]["1.1.coverage"] == "" and rows["eve"]["1.1.coverage"] == ""
    report = list(csv.DictReader((tmp_path / "grades_class_report.csv").open()))
    assert {r["criterion"] for r in report} == {k for k in rows["alice"] if k.startswith("1.1.")}
    # alice, bob.zip, dave, frank graded; bob.zip is the unopened starter: not attempted, no failure of it counted
    assert all((r["graded"], r["not_attempted"], r["attempted"]) == ("4", "1", "3") for r in report)
    assert not any("NotImplementedError" in r[f"failure_{k}"] for r in report for k in (1, 2, 3))
    page = (tmp_path / "grades_class_report.html").read_text()
    assert "carol.zip (rejected)" in page and "eve (grader_error)" in page
    assert "href='grades_results/alice/results.json'" in page


def test_notes_hold_one_entry_per_issue():
    figures = f"{NOT_SCORED}: the submission has no submit_figures/ folder"
    output = "\n".join(["missing file (graded as not implemented): a.py", figures,
                        "missing file (graded as not implemented): a.py", "Problem 1.2 scores 0: it imports grading"])
    assert batch.notes_of(output) == ("missing file (graded as not implemented): a.py | "
                                      "Problem 1.2 scores 0: it imports grading")
    assert batch.notes_of(figures) == ""
    crash = "grader error (not your fault; please tell the course staff):\nTraceback (most recent call last):\n" \
            "  File \"x.py\", line 1\nKeyError: 'x'"
    assert batch.notes_of(crash, "own note") == "own note | grader error: KeyError: 'x'"


def test_columns_only_for_the_chosen_problems():
    rows = [{"submission": "a", "problem_1.1": "2", "problem_4.1": "3", "1.1.sizes": "1", "4.1.x": "3"}]
    columns = grades_csv.columns_of(rows, ("1",))
    assert "problem_1.1" in columns and "problem_2.1" not in columns and "problem_4.1" not in columns
    assert columns[-2:] == ["1.1.sizes", "4.1.x"] and columns.index("results") < columns.index("1.1.sizes")


def test_a_grade_killed_midway_leaves_its_table_and_one_verdict(tmp_path, fork_servers):
    """As an outer limit kills a grade (``batch``'s, the bundle's ``timeout``): its stdout already holds the table of
    the problem it judged, and its row, results.json and report.txt state one verdict: 1.1's points, 1.2 cut."""
    hang = make_variant_kit(tmp_path / "k", [("data_parallel/comm.py", "average_gradients",
                                              "import time\nwhile True:\n    time.sleep(0.1)\n")])
    _folder(tmp_path / "grace", (ROOT / DATASET).read_text())
    (tmp_path / "grace" / "data_parallel" / "comm.py").write_text((hang / "data_parallel" / "comm.py").read_text())
    out = tmp_path / "out"
    out.mkdir()
    with open(out / "report.txt", "wb") as stdout:
        proc = subprocess.Popen([sys.executable, "-m", "grading", "grade", str(tmp_path / "grace"), "--problem", "1",
                                 "--json", str(out / "results.json"), "--quiet", "--timeout", "300"], cwd=ROOT,
                                env=dict(os.environ), stdin=subprocess.DEVNULL, stdout=stdout,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not (
                    "Problem 1.1" in (out / "report.txt").read_text() and '"running": "1.2"' in _text(out)):
                time.sleep(0.2)
        finally:
            batch._kill(proc, signal.SIGKILL)
    time.sleep(0.5)                                  # its fork server ends the grade it forked
    table = (out / "report.txt").read_text()
    assert "Problem 1.1" in table and "PASS" in table and "1.2." not in table.split("NOTE: the grade")[0], table
    row = batch.finished_row("grace", out, None, "", 600.0, 1.0)
    data = json.loads((out / "results.json").read_text())
    assert row["status"] == "timeout" and row["score"] == row["problem_1.1"] == "13" and data["score"] == 13, row
    assert row["notes"].startswith("partial score (timeout): ") and not any(k.startswith("1.2.") for k in row)
    cut = "not graded: cut: the grade's total time of 600 s ran out while running Problem 1.2"
    assert all(t["output"] == cut for t in data["tests"] if t["number"] == "1.2"), data["tests"]
    table = (out / "report.txt").read_text()
    assert table.splitlines()[-1].endswith(f"(13/{row['max_score']} in all)") and "running Problem 1.2" in table


def _text(out: Path) -> str:
    try:
        return (out / "results.json").read_text()
    except OSError:
        return ""
