"""Time limits: the CPU a case's clock counts with, a grade's total shared among its cases, and what a grade that
reaches its limit keeps (``cpus``, ``cpus.LoadClock``, ``runner.TotalTime``, ``results_json.PartialReport``,
``batch``)."""
import csv
import dataclasses
import io
import json
import os
import time

import pytest

from grading.commands import batch, grades_csv, grade, report, results_json
from grading.commands.class_report import write_class_report
from grading.commands.result_tests import is_not_graded, verdict
from common import cpus
from grading.engine.runner import NOT_GRADED, CriterionResult, TotalTime, out_of_time, run_cases
from grading.problems import all_cases
from grading.kit.variants import make_variant_kit

pytestmark = pytest.mark.kit
HANG = "import time\nwhile True:\n    time.sleep(0.1)\n"


def test_cpu_max_and_cfs_quota_parse_to_cpus():
    assert cpus.parse_cpu_max("50000 100000\n") == 0.5 and cpus.parse_cpu_max("200000 100000") == 2.0
    assert cpus.parse_cpu_max("max 100000") is None
    assert cpus.parse_cfs_quota("50000\n", "100000\n") == 0.5 and cpus.parse_cfs_quota("-1", "100000") is None
    for bad in ("", "50000", "max", "0 100000", "-5 100000", "50000 0", "half 100000", "1 2 3"):
        with pytest.raises(ValueError, match="cpu.max"):
            cpus.parse_cpu_max(bad)
    for quota, period in (("x", "100000"), ("0", "100000"), ("-2", "100000"), ("50000", "0")):
        with pytest.raises(ValueError, match="cfs_quota_us"):
            cpus.parse_cfs_quota(quota, period)


def test_the_smallest_quota_on_the_way_up_counts(tmp_path):
    (tmp_path / "cg" / "grade" / "ranks").mkdir(parents=True)          # cgroup v2: a quota on a parent cgroup
    (tmp_path / "cg" / "grade" / "cpu.max").write_text("50000 100000\n")
    (tmp_path / "cg" / "cpu.max").write_text("max 100000\n")
    (tmp_path / "v2").write_text("0::/grade/ranks\n")
    assert cpus.cpu_quota(tmp_path / "v2", tmp_path / "cg") == 0.5
    (tmp_path / "v1" / "cpu,cpuacct" / "job").mkdir(parents=True)      # cgroup v1, inside its namespace
    (tmp_path / "v1" / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("150000\n")
    (tmp_path / "v1" / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "v1.txt").write_text("4:memory:/x\n2:cpu,cpuacct:/elsewhere/on/the/host\n")
    assert cpus.cpu_quota(tmp_path / "v1.txt", tmp_path / "v1") == 1.5
    assert cpus.cpu_quota(tmp_path / "none", tmp_path / "cg") is None


def _verdict(cid: str, status: str, score: float = 0.0, message: str = "") -> CriterionResult:
    return CriterionResult(cid, cid.rsplit(".", 1)[0], "t", 2.0, score, status, message, 0.0)


def _pending(*ids: str) -> list[CriterionResult]:
    return [_verdict(c, "not_graded", message=NOT_GRADED + results_json.PENDING) for c in ids]


def test_a_grade_stopped_midway_keeps_what_it_judged(tmp_path):
    path = tmp_path / "results.json"
    partial = results_json.PartialReport(path, _pending("1.1.a", "1.2.b", "2.1.c"), ["a note"],
                                   transform=lambda m: m.replace("a.py", "b.py"))
    partial.running("1.1", ["1.1.a"])
    partial.judged([_verdict("1.1.a", "failed", 0.5, "a.py:3: wrong")])
    partial.running("1.2", ["1.2.b"])                                   # ... and here the grade is killed
    assert results_json.finalize(path, 124, 0) is False
    data = json.loads(path.read_text())
    assert data["score"] == 0.5 and data["max_score"] == 6.0 and data["stdout_visibility"] == "hidden"
    assert "extra_data" not in data and [t["score"] for t in data["tests"]] == [0.5, 0.0, 0.0]
    assert data["tests"][0]["output"] == "b.py:3: wrong"
    assert [is_not_graded(t) for t in data["tests"]] == [False, True, True]
    why = "the grade stopped with exit code 124"
    assert data["tests"][1]["output"] == f"{NOT_GRADED}cut: {why} while running Problem 1.2"
    assert data["tests"][2]["output"] == f"{NOT_GRADED}skipped: {why} before Problem 2.1 started"
    assert data["output"].count(why) == 2 and "a note" in data["output"]
    assert results_json.finalize(path, 0, 0) is True                          # a finished report is kept as it is
    assert results_json.finish(path, "again") is None


def test_each_criterion_not_graded_names_its_own_reason(tmp_path):
    """3.1's case was skipped for lack of time (its share under a second), 3.2 was graded, the grade was killed
    while 3.3 ran and 3.4 never started: each keeps its own reason (3.1 never carries 3.3's)."""
    path = tmp_path / "results.json"
    partial = results_json.PartialReport(path, _pending("3.1.a", "3.2.b", "3.3.c", "3.4.d"), [])
    partial.judged([_verdict("3.1.a", "not_graded", message=NOT_GRADED + TotalTime(40.0, 0.0).ran_out("3.1", False))])
    partial.running("3.2", ["3.2.b"])
    partial.judged([_verdict("3.2.b", "passed", 2.0)])
    partial.running("3.3", ["3.3.c"])
    data = results_json.finish(path, out_of_time(40.0))
    by_id = {t["name"].split(":")[0]: t["output"] for t in data["tests"]}
    assert by_id["3.1.a"] == "not graded: skipped: the grade's total time of 40 s ran out before Problem 3.1 started"
    assert by_id["3.2.b"] == "passed"
    assert by_id["3.3.c"] == "not graded: cut: the grade's total time of 40 s ran out while running Problem 3.3"
    assert by_id["3.4.d"] == "not graded: skipped: the grade's total time of 40 s ran out before Problem 3.4 started"
    assert not any("3.3" in by_id[c] for c in ("3.1.a", "3.4.d"))
    assert verdict(data).why == (
        "the grade's total time of 40 s ran out while running Problem 3.3: 1 check(s) cut, not graded",
        "the grade's total time of 40 s ran out before Problem(s) 3.1, 3.4 started: 2 check(s) skipped, not graded")


def _killed_row(tmp_path, judged: list[CriterionResult]) -> tuple[dict, dict, str]:
    """A grade of 1.1 and 1.2 killed at its limit (95 s) while 1.2 ran, after ``judged``: (its grades.csv row,
    its results.json, its report.txt), as ``batch.finished_row`` leaves them."""
    out = tmp_path / "alice"
    out.mkdir()
    partial = results_json.PartialReport(out / "results.json", _pending("1.1.a", "1.1.b", "1.2.c"), [])
    live_out = io.StringIO()
    live = report.LiveTable(_pending("1.1.a", "1.1.b", "1.2.c"), [], out=live_out)
    partial.running("1.1", ["1.1.a", "1.1.b"])
    partial.judged(judged)
    live.judged(judged)
    partial.running("1.2", ["1.2.c"])
    (out / "report.txt").write_text(live_out.getvalue())
    row = batch.finished_row("alice", out, None, "", 95.0, 96.0)
    return row, json.loads((out / "results.json").read_text()), (out / "report.txt").read_text()


def test_a_timed_out_row_reads_the_same_in_all_four_places(tmp_path):
    """Its score (what it judged), the criteria judged and the reason agree in grades.csv, results.json,
    report.txt and the class report."""
    row, data, text = _killed_row(tmp_path, [_verdict("1.1.a", "passed", 2.0), _verdict("1.1.b", "failed", 0.0, "x")])
    reason = "the grade's total time of 95 s ran out while running Problem 1.2: 1 check(s) cut, not graded"
    assert row["status"] == "timeout" and row["score"] == "2" and row["max_score"] == "6"
    assert data["score"] == 2.0 == verdict(data).score
    assert (row["1.1.a"], row["1.1.b"], "1.2.c" in row) == ("2", "0", False)          # judged: columns; cut: none
    assert row["notes"].split(batch.NOTE_SEPARATOR) == ["partial score (timeout): 2 of 3 check(s) graded", reason]
    assert data["output"] == reason and data["tests"][2]["output"].startswith(NOT_GRADED + "cut: ")
    assert text.index("PASS") < text.index("Problem 1.1") + 200 and "1.2.c" not in text        # 1.1's block
    assert f"NOTE: {reason}" in text and "NOTE: partial score (timeout): 2 of 3 check(s) graded" in text
    assert text.rstrip().endswith("TOTAL 2/6 public points, no hidden points")
    assert batch.progress_line(row, 1, 3) == f"[1/3] alice: 2/6 (timeout: {reason}) in 96.0 s"
    counted, named = batch.class_report_inputs([row], tmp_path)
    assert list(counted) == ["alice"] and named == {}
    paths = write_class_report(tmp_path / "grades.csv", counted, named, students=[row], problems=("1",))
    stats = {r["criterion"]: r for r in csv.DictReader(paths["csv"].open(newline=""))}
    assert set(stats) == {"1.1.a", "1.1.b"} and (stats["1.1.a"]["passed"], stats["1.1.b"]["graded"]) == ("1", "1")


def test_a_timed_out_row_that_judged_nothing_is_blank_in_all_four_places(tmp_path):
    row, data, text = _killed_row(tmp_path, [])
    assert row["status"] == "timeout" and row["score"] == "" and row["max_score"] == "6"
    assert "score" not in data and verdict(data).score is None                          # a blank, never 0
    assert not any(grades_csv.is_criterion_column(k) for k in row)
    assert row["notes"].startswith("score left blank (timeout)" + batch.NOTE_SEPARATOR)
    assert text.rstrip().endswith("TOTAL score left blank: no check was graded")
    for problem, count in (("1.1", 2), ("1.2", 1)):       # both had started when the grade was killed
        reason = f"the grade's total time of 95 s ran out while running Problem {problem}: {count} check(s) cut"
        assert f"NOTE: {reason}, not graded" in text and f"{reason}, not graded" in row["notes"]
        assert f"{reason}, not graded" in data["output"]
    counted, named = batch.class_report_inputs([row], tmp_path)
    assert counted == {} and named == {"alice": "timeout"}
    # Gradescope has no blank: the bundle's last step gives it the sum of the tests, 0, its output saying why
    results_json.finalize(tmp_path / "alice" / "results.json", 137, 0)
    assert json.loads((tmp_path / "alice" / "results.json").read_text())["score"] == 0


def test_the_staff_table_is_written_as_each_problem_ends():
    listed = _pending("1.1.a", "1.2.b", "2.1.c")
    out = io.StringIO()
    live = report.LiveTable(listed, ["a note"], out=out)
    assert out.getvalue() == "NOTE: a note\n\n"
    live.judged([_verdict("1.2.b", "failed", 0.0, "wrong")])              # 1.1 not yet: nothing more
    assert "Problem" not in out.getvalue()
    done = [_verdict("1.1.a", "passed", 2.0), _verdict("1.2.b", "failed", 0.0, "wrong"),
            _verdict("2.1.c", "passed", 2.0)]
    live.judged(done[:1])
    assert "1.1.a" in out.getvalue() and "1.2.b" in out.getvalue() and "2.1.c" not in out.getvalue()
    live.close(done, ["a note"])
    assert out.getvalue() == report.table(done, ["a note"]) + "\n"     # written whole, it is the table


def test_the_grades_clock_starts_with_its_process(monkeypatch):
    monkeypatch.setenv(grade.STARTED_ENV, repr(time.time() - 30.0))      # `python -m grading grade` began 30 s ago
    before = time.monotonic()
    assert grade.process_started() <= before - 29.0 and grade.STARTED_ENV not in os.environ
    assert grade.process_started() >= before                            # not recorded: a grade in this process


def test_a_grade_limit_counts_only_the_cases_it_runs():
    one = [c for c in all_cases() if c.name == "p1_partition"]
    assert batch.default_limit_s(["--problem", "1.1", "--timeout", "5"]) == 5 + 30 * len(one) + 60
    assert batch.default_limit_s([]) == sum(c.timeout_s + 30 for c in all_cases()) + 60


def test_a_case_shares_what_is_left_in_proportion_to_its_limit():
    total = TotalTime(100.0, time.monotonic() + 6000.0)                 # a far deadline: no verdict on load
    assert 2990.0 < total.share_s(30.0, 60.0) <= 3000.0 and 5980.0 < total.share_s(60.0, 60.0) <= 6000.0
    assert TotalTime(100.0, time.monotonic() - 1).share_s(30.0, 60.0) == 0.0
    assert total.ran_out("2.1", False) == "skipped: the grade's total time of 100 s ran out before Problem 2.1 started"
    assert total.ran_out("2.1", True) == "cut: the grade's total time of 100 s ran out while running Problem 2.1"


def test_a_case_whose_share_is_under_a_second_is_skipped_in_words(tmp_path):
    """No case starts with a limit under a second (it would read "the limit of 0 s"): with the total spent,
    every case is skipped before its problem starts, and nothing is spawned."""
    cases = [c for c in all_cases() if c.name in ("p1_partition", "p2_schedule_split")]
    verdicts = run_cases(cases, tmp_path, tmp_path / "runs", servers=None, total=TotalTime(40.0, time.monotonic()))
    assert {v.status for v in verdicts} == {"not_graded"} and not (tmp_path / "runs").exists()
    for v in verdicts:
        assert v.message == (f"{NOT_GRADED}skipped: the grade's total time of 40 s ran out before Problem "
                             f"{v.problem} started"), v.message


def test_hangs_in_two_problems_cannot_starve_a_third(tmp_path, fork_servers):
    """Problems 1.1 and 2.1 hang; their limits (40 s each) cannot both fit the total (16 s): each is cut to its
    share, and Problem 3.2, after them, keeps every point (its share of the total fits it on a busy machine)."""
    kit = make_variant_kit(tmp_path / "kit", [("data_parallel/dataset.py", "partition_indices", HANG),
                                              ("pipeline/schedule.py", "clock_cycles", HANG)])
    limits = {"p1_partition": 40.0, "p2_schedule_split": 40.0, "p3_adapter_io": 80.0}
    cases = [dataclasses.replace(c, timeout_s=limits[c.name]) for c in all_cases() if c.name in limits]
    seen = []
    verdicts = run_cases(cases, kit, tmp_path / "runs", servers=fork_servers,
                         total=TotalTime(16.0, time.monotonic() + 16.0),
                         judged=lambda case, v, result: seen.append((case.name, result is not None)))
    by_problem = {p: [v for v in verdicts if v.problem == p] for p in ("1.1", "2.1", "3.2")}
    assert all(v.passed for v in by_problem["3.2"]), [v.message for v in by_problem["3.2"]]
    for problem in ("1.1", "2.1"):
        assert not any(v.passed for v in by_problem[problem])
        cut = [v for v in by_problem[problem] if v.status == "failed"]
        assert all("limit was cut from 40 s to" in v.message for v in cut) or \
            all(v.status == "not_graded" for v in by_problem[problem]), [v.message for v in by_problem[problem]]
    assert [name for name, _ in seen] == list(limits)


def test_what_run_autograder_prints_names_no_hidden_criterion():
    verdicts = [_verdict("1.1.a", "passed", 2.0), _verdict("1.2.b", "not_graded", message=NOT_GRADED + "no time"),
                dataclasses.replace(_verdict("1.1.a_hidden", "failed", message="clock_cycles(14, 8)"), hidden=True)]
    public = report.table(verdicts, public=True)
    assert "_hidden" not in public and "14, 8" not in public
    assert "TOTAL 2/4 public points + 2 hidden points the course adds when it grades (2/6 in all)" in public
    assert "1 more check(s)" in public and "SKIP" in public
    assert "1.1.a_hidden" in report.table(verdicts)                      # the staff's table has it
    data = results_json.gradescope_json(verdicts)
    assert data["stdout_visibility"] == "hidden" and data["tests"][2]["visibility"] == "after_published"
