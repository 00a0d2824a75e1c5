"""Time limits: the CPU a case's clock counts with, a grade's total shared among its cases, and what a grade that
reaches its limit keeps (``cpus``, ``launch.LoadClock``, ``runner.TotalTime``, ``report.PartialReport``, ``batch``)."""
import dataclasses
import json
import time

import pytest

from grading.commands import batch, report
from grading.commands.result_tests import is_not_graded
from grading.engine import cpus
from grading.engine.runner import NOT_GRADED, CriterionResult, TotalTime, run_cases
from grading.problems import all_cases
from tests.kit.variants import make_variant_kit

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


def test_a_grade_stopped_midway_keeps_what_it_judged(tmp_path):
    path = tmp_path / "results.json"
    listed = [_verdict(c, "not_graded", message=NOT_GRADED + "not yet") for c in ("1.1.a", "1.2.b", "2.1.c")]
    partial = report.PartialReport(path, listed, ["a note"], transform=lambda m: m.replace("a.py", "b.py"))
    partial.running("1.1")
    partial.judged([_verdict("1.1.a", "failed", 0.5, "a.py:3: wrong")])
    partial.running("1.2")                                              # ... and here the grade is killed
    assert report.finalize(path, 124, 0) is False
    data = json.loads(path.read_text())
    assert data["score"] == 0.5 and data["max_score"] == 6.0 and data["stdout_visibility"] == "hidden"
    assert "extra_data" not in data and [t["score"] for t in data["tests"]] == [0.5, 0.0, 0.0]
    assert data["tests"][0]["output"] == "b.py:3: wrong"
    assert [is_not_graded(t) for t in data["tests"]] == [False, True, True]
    reason = "the grade stopped with exit code 124 while running Problem 1.2"
    assert data["tests"][1]["output"] == NOT_GRADED + reason
    assert data["output"].count(reason) == 1 and "a note" in data["output"]
    assert report.finalize(path, 0, 0) is True                          # a finished report is kept as it is
    assert report.finish(path, "again") is None


def test_a_timed_out_row_and_its_results_json_agree(tmp_path):
    out = tmp_path / "alice"
    out.mkdir()
    listed = [_verdict(c, "not_graded", message=NOT_GRADED + "not yet") for c in ("1.1.a", "1.2.b")]
    partial = report.PartialReport(out / "results.json", listed, [])
    partial.judged([_verdict("1.1.a", "passed", 2.0)])
    partial.running("1.2")
    status, data = batch._verdict(out / "results.json", None, "", 95.0)
    assert status == "timeout" and data["score"] == 2.0 and batch.criterion_cells(data) == {"1.1.a": "2"}
    reason = "the grade reached its total time of 95 s while running Problem 1.2"
    assert data["tests"][1]["output"] == NOT_GRADED + reason and data["output"].count(reason) == 1
    row = {"submission": "alice", "score": "2", "max_score": "4", "status": status, "seconds": "96.0",
           "notes": batch.NOTE_SEPARATOR.join(["partial score (timeout)", batch.notes_of(data["output"])])}
    assert batch.progress_line(row, 1, 3) == (f"[1/3] alice: 2/4 (timeout: {reason}: 1 check(s) not graded, every "
                                              "other one keeps its verdict) in 96.0 s")


def test_a_grade_limit_counts_only_the_cases_it_runs():
    one = [c for c in all_cases() if c.name == "p1_partition"]
    assert batch.default_limit_s(["--problem", "1.1", "--timeout", "5"]) == 5 + 30 * len(one) + 60
    assert batch.default_limit_s([]) == sum(c.timeout_s + 30 for c in all_cases()) + 60


def test_a_case_shares_what_is_left_in_proportion_to_its_limit():
    total = TotalTime(100.0, time.monotonic() + 6000.0)                 # a far deadline: no verdict on load
    assert 2990.0 < total.share_s(30.0, 60.0) <= 3000.0 and 5980.0 < total.share_s(60.0, 60.0) <= 6000.0
    assert TotalTime(100.0, time.monotonic() - 1).share_s(30.0, 60.0) == 0.0
    assert total.reached("2.1") == "the grade reached its total time of 100 s while running Problem 2.1"


def test_hangs_in_two_problems_cannot_starve_a_third(tmp_path, fork_servers):
    """Problems 1.1 and 2.1 hang; their limits (20 s each) cannot both fit the total (8 s): each is cut to its
    share, and Problem 3.2, after them, keeps every point."""
    kit = make_variant_kit(tmp_path / "kit", [("data_parallel/dataset.py", "partition_indices", HANG),
                                              ("pipeline/schedule.py", "clock_cycles", HANG)])
    limits = {"p1_partition": 20.0, "p2_schedule_split": 20.0, "p3_adapter_io": 80.0}
    cases = [dataclasses.replace(c, timeout_s=limits[c.name]) for c in all_cases() if c.name in limits]
    seen = []
    verdicts = run_cases(cases, kit, tmp_path / "runs", servers=fork_servers,
                         total=TotalTime(8.0, time.monotonic() + 8.0),
                         judged=lambda case, v, result: seen.append((case.name, result is not None)))
    by_problem = {p: [v for v in verdicts if v.problem == p] for p in ("1.1", "2.1", "3.2")}
    assert all(v.passed for v in by_problem["3.2"]), [v.message for v in by_problem["3.2"]]
    for problem in ("1.1", "2.1"):
        assert not any(v.passed for v in by_problem[problem])
        cut = [v for v in by_problem[problem] if v.status == "failed"]
        assert all("limit was cut from 20 s to" in v.message for v in cut) or \
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
    data = report.gradescope_json(verdicts)
    assert data["stdout_visibility"] == "hidden" and data["tests"][2]["visibility"] == "after_published"
