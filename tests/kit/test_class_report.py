"""The class report (grading/commands/class_report.py: criteria, score distributions, page) and formula-safe
CSV cells (csv_cells.py), on results.json data made by hand (test_slurm.py and test_batch.py check both on real
grades)."""
from __future__ import annotations

import csv

import pytest

from grading.commands.class_report import problem_scores, report_paths, summary_rows, write_class_report
from grading.commands.result_tests import not_attempted
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


def _test(cid: str, status: str, output: str = "passed", points: float = 1.0, hidden: bool = False) -> dict:
    return {"name": f"{cid}: title of {cid}", "number": cid.rsplit(".", 1)[0], "score": points if status == "passed"
            else 0.0, "max_score": points, "status": status, "output": output,
            "visibility": "after_published" if hidden else "visible"}


STUB = "NotImplementedError: Problem {p}: implement it (at data_parallel/dataset.py:40 (in partition_indices))"


def test_pass_rates_and_the_largest_failure_groups_per_criterion(tmp_path):
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
    paths = write_class_report(tmp_path / "grades.csv", results, {"<e>": "rejected"}, problems=("1", "2"))
    assert paths == report_paths(tmp_path / "grades.csv") and paths["csv"].name == "grades_class_report.csv"
    rows = list(csv.DictReader(paths["csv"].open(newline="")))
    assert [r["criterion"] for r in rows] == ["1.2.grads", "2.1.cycles"]        # 0-point criteria are not graded
    grads, cycles = rows
    assert (grads["graded"], grads["attempted"], grads["passed"], grads["pass_rate"]) == ("4", "4", "1", "0.250")
    assert grads["failure_1"] == diff.format(r=1, d="3.1e-02") and grads["sharing_1"] == "2"    # numbers masked
    assert grads["likely_cause_1"] == "a sum without division" and grads["points"] == "1"
    assert (grads["failure_2"], grads["sharing_2"], grads["failure_3"]) == ("'=cmd|' /C calc'!A0", "1", "")
    assert (cycles["pass_rate"], cycles["failure_1"], cycles["sharing_1"]) == ("0.750", "'-2+3", "1")
    text = paths["csv"].read_text()
    assert "=cmd" not in text.replace("'=cmd", "")
    page = paths["html"].read_text()
    assert "&lt;e&gt; (rejected)" in page and "<e>" not in page and "grades_class_report.png" in page
    assert "likely cause: a sum without division" in page
    assert paths["png"].read_bytes().startswith(b"\x89PNG")
    assert paths["scores_png"].read_bytes().startswith(b"\x89PNG")


def test_an_unopened_starter_is_not_attempted_and_never_the_common_failure(tmp_path):
    """A starter's stubs count neither as passed nor as failed: the largest failure group is the buggy
    submission's, with the likely cause its own result gives; a sub-problem with one criterion past its stub was
    attempted (its stub failures are failures)."""
    cause = "the seed was not passed on to partition_indices"
    starter = {"tests": [_test("1.1.exact", "failed", STUB.format(p="1.1")),
                         _test("1.1.sizes", "failed", STUB.format(p="1.1")),
                         _test("1.1.exact_hidden", "failed", STUB.format(p="1.1"), hidden=True)]}
    results = {f"starter{k}": starter for k in range(3)}
    results["buggy"] = {"tests": [_test("1.1.exact", "failed", f"rank 0 loads [3, 1]..., expected [2, 0]...\n"
                                                               f"likely cause: {cause}"),
                                  _test("1.1.sizes", "passed"), _test("1.1.exact_hidden", "passed", hidden=True)]}
    results["half"] = {"tests": [_test("1.1.exact", "failed", STUB.format(p="1.1")), _test("1.1.sizes", "passed"),
                                 _test("1.1.exact_hidden", "failed", STUB.format(p="1.1"), hidden=True)]}
    results["reference"] = {"tests": [_test("1.1.exact", "passed"), _test("1.1.sizes", "passed"),
                                      _test("1.1.exact_hidden", "passed", hidden=True)]}
    assert not_attempted(starter) == {"1.1"} and not_attempted(results["half"]) == set()
    paths = write_class_report(tmp_path / "grades.csv", results, problems=("1",))
    rows = {r["criterion"]: r for r in csv.DictReader(paths["csv"].open(newline=""))}
    exact = rows["1.1.exact"]
    assert (exact["graded"], exact["not_attempted"], exact["attempted"], exact["passed"]) == ("6", "3", "3", "1")
    assert exact["pass_rate"] == "0.333" and exact["visibility"] == "public"
    assert exact["failure_1"].startswith("rank 0 loads") and exact["likely_cause_1"] == cause
    assert exact["failure_2"].startswith("NotImplementedError") and exact["sharing_2"] == "1"     # "half" only
    assert rows["1.1.exact_hidden"]["visibility"] == "hidden" and rows["1.1.sizes"]["pass_rate"] == "1.000"
    # per problem: public and hidden subtotals; the starters did not attempt it
    (scores,) = list(csv.DictReader(paths["scores_csv"].open(newline="")))
    assert (scores["problem"], scores["graded"], scores["not_attempted"]) == ("1", "6", "3")
    assert (scores["public_max"], scores["hidden_max"], scores["max_score"]) == ("2", "1", "3")
    assert scores["attempted"] == "3"                   # the means count only those: 4/3 public, 2/3 hidden points
    assert (scores["public_mean"], scores["hidden_mean"], scores["full_marks"]) == ("1.33", "0.67", "1")
    page = paths["html"].read_text()
    assert f"{scores['mean']} / 3 of 3 attempted" in page
    assert "grades_class_report_scores.png" in page and paths["scores_png"].read_bytes().startswith(b"\x89PNG")


def test_score_distribution_per_chosen_problem_with_public_and_hidden_subtotals():
    results = {"a": {"tests": [_test("1.1.x", "passed", points=2), _test("1.1.h", "passed", hidden=True),
                               _test("4.1.x", "passed", points=5)]},
               "b": {"tests": [_test("1.1.x", "failed", "wrong", points=2), _test("1.1.h", "passed", hidden=True)]}}
    (one, two) = problem_scores(results, ("1", "2"))                        # 4 is not chosen: not shown
    assert (one.problem, one.names, one.public, one.hidden) == ("1", ["a", "b"], [2.0, 0.0], [1.0, 1.0])
    assert (one.public_max, one.hidden_max, one.totals, one.not_attempted) == (2.0, 1.0, [3.0, 1.0], 0)
    assert (two.problem, two.totals) == ("2", [])
    rows = summary_rows([one, two])
    assert (rows[0]["median"], rows[0]["full_marks"], rows[1]["graded"], rows[1]["mean"]) == ("2", 1, 0, "")


def test_the_page_links_each_student_to_its_results(tmp_path):
    students = [{"submission": "al ice", "score": "3", "max_score": "3", "status": "passed", "problem_1.1": "3",
                 "notes": "", "results": "grades_results/al ice/results.json"},
                {"submission": "<b>", "score": "", "max_score": "", "status": "grader_error", "notes": "score left "
                 "blank (grader_error) | the grader exited with code -9 without a report", "results": ""}]
    paths = write_class_report(tmp_path / "grades.csv", {"al ice": {"tests": [_test("1.1.x", "passed", points=3)]}},
                               {"<b>": "grader_error"}, students=students, problems=("1",))
    page = paths["html"].read_text()
    assert "href='grades_results/al%20ice/results.json'" in page and "href='grades_results/al%20ice/report.txt'" in page
    assert "&lt;b&gt;" in page and "<b>" not in page.replace("<b>[", "") and "never upload it as 0" in page


def test_a_grade_that_ran_out_of_time_counts_what_it_judged(tmp_path):
    """A timed-out submission's criteria listed as not graded count nowhere (neither failed nor in a score), its
    judged ones count as for any other submission: the class report agrees with the row's partial score."""
    cut = "not graded: cut: the grade's total time of 95 s ran out while running Problem 1.2"
    results = {"late": {"tests": [_test("1.1.x", "passed", points=2), _test("1.2.y", "failed", cut, points=3)]},
               "done": {"tests": [_test("1.1.x", "failed", "wrong", points=2), _test("1.2.y", "passed", points=3)]}}
    paths = write_class_report(tmp_path / "grades.csv", results, problems=("1",))
    rows = {r["criterion"]: r for r in csv.DictReader(paths["csv"].open(newline=""))}
    assert (rows["1.1.x"]["graded"], rows["1.1.x"]["passed"]) == ("2", "1")
    assert (rows["1.2.y"]["graded"], rows["1.2.y"]["passed"], rows["1.2.y"]["failure_1"]) == ("1", "1", "")
    assert "not graded" not in paths["csv"].read_text() + paths["html"].read_text()
    (scores,) = list(csv.DictReader(paths["scores_csv"].open(newline="")))
    assert scores["graded"] == "2" and scores["mean"] == "2.50"            # late: 2 (what it judged), done: 3
