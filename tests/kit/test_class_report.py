"""The class report (grading/commands/class_report.py) and formula-safe CSV cells (csv_cells.py), on results.json
data made by hand (test_slurm.py and test_batch.py check both on real grades)."""
from __future__ import annotations

import csv

import pytest

from grading.commands.class_report import report_paths, write_class_report
from grading.commands.csv_cells import safe_cell, write_csv

pytestmark = pytest.mark.kit


@pytest.mark.parametrize("value, cell", [
    ("=1+1", "'=1+1"), ("+cmd", "'+cmd"), ("-x", "'-x"), ("@SUM(A1)", "'@SUM(A1)"), ("\t=x", "'\t=x"),
    ("\r=x", "'\r=x"), ("alice", "alice"), ("a=b", "a=b"), ("-3.5", "-3.5"), ("+2", "+2"), ("1e-3", "1e-3"),
    (13, "13"), (None, ""), ("", ""),
])
def test_safe_cell(value, cell):
    assert safe_cell(value) == cell


def test_write_csv_neutralises_every_cell_and_reads_back(tmp_path):
    path = write_csv(tmp_path / "sub" / "x.csv", ["name", "=h"], [{"name": "=HYPERLINK(\"a,b\")"}, ["-1", "@x"]])
    rows = list(csv.reader(path.open(newline="")))
    assert rows == [["name", "'=h"], ["'=HYPERLINK(\"a,b\")", ""], ["-1", "'@x"]]


def _test(cid: str, status: str, output: str = "passed", points: float = 1.0) -> dict:
    return {"name": f"{cid}: title of {cid}", "number": cid.rsplit(".", 1)[0], "score": points if status == "passed"
            else 0.0, "max_score": points, "status": status, "output": output}


def test_pass_rates_and_the_most_common_failure_per_criterion(tmp_path):
    diff = "rank {r}: grad of '2.weight' differs from the serial gradient by {d} (tolerance 1e-06)"
    results = {
        "a": {"tests": [_test("1.2.grads", "failed", diff.format(r=1, d="3.1e-02") + "\nlikely cause: a sum without "
                                                                                  "division"),
                        _test("2.1.cycles", "passed")]},
        "b": {"tests": [_test("1.2.grads", "failed", diff.format(r=0, d="4.0e-01")), _test("2.1.cycles", "passed")]},
        "c": {"tests": [_test("1.2.grads", "failed", "=cmd|' /C calc'!A0"), _test("2.1.cycles", "failed", "-2+3")]},
        "d": {"tests": [_test("1.2.grads", "passed"), _test("2.1.cycles", "passed"),
                        _test("benchmarks.dp_speedup", "failed", "not applicable", points=0)]},
    }
    paths = write_class_report(tmp_path / "grades.csv", results, {"<e>": "rejected"})
    assert paths == report_paths(tmp_path / "grades.csv") and paths["csv"].name == "grades_class_report.csv"
    rows = list(csv.DictReader(paths["csv"].open(newline="")))
    assert [r["criterion"] for r in rows] == ["1.2.grads", "2.1.cycles"]        # 0-point criteria are not graded
    grads, cycles = rows
    assert (grads["graded"], grads["passed"], grads["pass_rate"], grads["sharing"]) == ("4", "1", "0.250", "2")
    assert grads["common_failure"] == diff.format(r=1, d="3.1e-02")             # numbers masked when grouping
    assert grads["likely_cause"] == "a sum without division" and grads["points"] == "1"
    assert (cycles["pass_rate"], cycles["common_failure"], cycles["sharing"]) == ("0.750", "'-2+3", "1")
    text = paths["csv"].read_text()
    assert "=cmd" not in text.replace("'=cmd", "")
    page = paths["html"].read_text()
    assert "&lt;e&gt; (rejected)" in page and "<e>" not in page and "grades_class_report.png" in page
    assert paths["png"].read_bytes().startswith(b"\x89PNG")
