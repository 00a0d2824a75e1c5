"""``batch --slurm`` / ``--run-task`` / ``--collect`` (grading/commands/slurm.py), run locally.

No Slurm here: the array tasks run as ``SLURM_ARRAY_TASK_ID=k bash OUT/grade.sbatch`` in any order, one twice, one
stopped midway, and the script's ``#SBATCH`` directives are checked by parsing (``sbatch --test-only`` style).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from grading.__main__ import main as grading_main
from grading.commands import slurm
from grading.commands.options import DEFAULT_CPUS, DEFAULT_MEM, add_slurm_resource_options, slurm_resources
from grading.commands.report import EXIT_GRADER_ERROR
from grading.kit.secret import SECRET_ENV
from common import ROOT
from common.regions import parse_regions
from grading.kit.splice import replace_bodies, stub_body
from grading.commands.variants import declared

pytestmark = pytest.mark.kit
DATASET = "data_parallel/dataset.py"
FORMULA = '=HYPERLINK("x")'
DROPS_LAST = next(v for v in declared("1.1") if v.name == "drops_last_short_batch")


def _with_body(function: str | None, body: str | None = None) -> str:
    """The kit's dataset.py with ``function``'s region replaced (None: every region stubbed, the starter)."""
    text = (ROOT / DATASET).read_text()
    regions = parse_regions(text, DATASET)
    if function is None:
        return replace_bodies(text, DATASET, {k: stub_body(r) for k, r in enumerate(regions)})
    k = next(k for k, r in enumerate(regions) if r.function == function)
    return replace_bodies(text, DATASET, {k: textwrap.indent(textwrap.dedent(body).strip("\n") + "\n",
                                                             regions[k].indent)})


def _folder(root: Path, text: str) -> None:
    (root / "data_parallel").mkdir(parents=True)
    (root / DATASET).write_text(text)


def _class(tmp_path: Path) -> Path:
    """Five submissions: full marks, two bugs losing one criterion each (one named like a formula; the other's
    failure comes with a likely cause), the starter, a rejected zip whose name starts with ``@`` (a formula in a
    spreadsheet too)."""
    subs = tmp_path / "submissions"
    seeded = next(v for v in declared("1.1") if v.name == "global_random_seeded")
    _folder(subs / "alice", (ROOT / DATASET).read_text())
    _folder(subs / FORMULA, _with_body("partition_indices", seeded.body))
    _folder(subs / "-dash", _with_body("partition_dataset", DROPS_LAST.body))
    with zipfile.ZipFile(subs / "bob.zip", "w") as z:
        z.writestr(f"a5/{DATASET}", _with_body(None))
    with zipfile.ZipFile(subs / "@carol.zip", "w") as z:
        z.writestr("../../escape.py", "x = 1")
    return subs


def _task(out: Path, task_id: int, **popen) -> subprocess.Popen:
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(task_id)}
    return subprocess.Popen(["bash", str(out / slurm.SCRIPT)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, **popen)


def _run_tasks(out: Path, ids: list[int]) -> None:
    """Run the tasks two at a time (array tasks run side by side), each to the end."""
    for k in range(0, len(ids), 2):
        procs = [_task(out, t) for t in ids[k:k + 2]]
        for proc in procs:
            output = proc.communicate()[0].decode(errors="replace")
            assert proc.returncode == 0, output


def _rows(path: Path) -> tuple[list[str], list[dict]]:
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def _without_seconds(path: Path) -> tuple[list[str], list[dict]]:
    header, rows = _rows(path)
    return header, [{k: v for k, v in row.items() if k not in ("seconds", "results")} for row in rows]


def test_array_run_locally_matches_batch_and_resubmits_only_what_is_missing(tmp_path, capsys):
    subs = _class(tmp_path)
    # `batch --jobs 1` as the reference, side by side with the array's tasks (its rows do not depend on timing)
    reference = subprocess.Popen([sys.executable, "-m", "grading", "batch", str(subs), "--out",
                                  str(tmp_path / "batch" / "grades.csv"), "--jobs", "1", "--problem", "1.1",
                                  "--quiet"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = tmp_path / "array"
    assert grading_main(["batch", str(subs), "--slurm", str(out), "--problem", "1.1", "--max-parallel", "2"]) == 0
    assert f"bash {out / slurm.SUBMIT}" in capsys.readouterr().out
    tasks = json.loads((out / slurm.TASKS).read_text())["tasks"]
    assert [t["submission"] for t in tasks] == sorted(p.name for p in subs.iterdir())
    assert slurm.check_script(out / slurm.SCRIPT, len(tasks)) == []
    ids = {t["submission"]: t["id"] for t in tasks}

    # any order; the rejected zip twice (a re-queued task overwrites its result)
    _run_tasks(out, [ids["@carol.zip"], ids["bob.zip"], ids["alice"], ids["@carol.zip"]])
    # FORMULA's task is stopped midway (scancel / the time limit send SIGTERM): it keeps no result
    stopped = _task(out, ids[FORMULA], start_new_session=True)
    while not list((out / slurm.RESULTS).glob(f"{slurm.ATTEMPT_PREFIX}{ids[FORMULA]}-*/report.txt")):
        assert stopped.poll() is None, stopped.communicate()[0]
        time.sleep(0.2)
    os.killpg(stopped.pid, signal.SIGTERM)
    assert stopped.wait() != 0
    # "-dash" never ran
    merged = tmp_path / "merged" / "grades.csv"
    assert grading_main(["batch", "--collect", str(out), "--out", str(merged)]) == 1
    printed = capsys.readouterr()
    assert f"missing: task {ids[FORMULA]}" in printed.err and "has no result (killed midway" in printed.err
    assert f"missing: task {ids['-dash']}" in printed.err and "not run yet" in printed.err
    assert {row["submission"] for row in _rows(merged)[1]} == {"'@carol.zip", "bob.zip", "alice"}
    results = out / slurm.RESULTS
    assert sorted(p.name for p in results.iterdir() if not p.name.startswith(slurm.ATTEMPT_PREFIX)) == \
        ["@carol.zip", "alice", "bob.zip"]
    assert json.loads((results / "@carol.zip" / slurm.ROW).read_text())["task"] == ids["@carol.zip"]

    resubmit = (out / "resubmit.sh").read_text()
    spec = re.search(r"bash (\S+) --array=(\S+)", resubmit)
    assert spec and Path(spec[1]) == out / slurm.SUBMIT
    spec = [None, spec[2]]
    again = sorted({ids[FORMULA], ids["-dash"]})
    assert spec[1] == slurm.array_spec(again, 2)
    _run_tasks(out, [int(x) for x in spec[1].split("%")[0].replace("-", ",").split(",")])
    assert grading_main(["batch", "--collect", str(out), "--out", str(merged), "--similarity",
                         str(tmp_path / "similarity")]) == 0
    assert not (out / "resubmit.sh").exists()
    assert not [p for p in results.iterdir() if p.name.startswith(slurm.ATTEMPT_PREFIX)]

    # the same grades.csv as `batch --jobs 1` (but for the seconds each grade took)
    assert reference.wait() == 0, reference.communicate()[0]
    assert _without_seconds(merged) == _without_seconds(tmp_path / "batch" / "grades.csv")
    header, rows = _rows(merged)
    by_name = {row["submission"]: row for row in rows}
    assert "'" + FORMULA in by_name and "'-dash" in by_name and "'@carol.zip" in by_name   # neutralised names
    assert by_name["alice"]["score"] == "13" and by_name["'" + FORMULA]["1.1.rng_untouched"] == "0"
    assert by_name["'@carol.zip"]["status"] == "rejected" and by_name["bob.zip"]["status"] == "incomplete"
    assert (merged.parent / by_name["alice"]["results"]).is_file()          # a link relative to the CSV's folder

    # the class report lists every criterion with the pass rate grades.csv gives, among the submissions that
    # attempted it: the starter (bob.zip) did not, and none of its stubs is a failure
    report_header, report = _rows(merged.with_name("grades_class_report.csv"))
    criteria = header[header.index("results") + 1:]
    assert [r["criterion"] for r in report] == criteria and len(criteria) == 12
    for r in report:
        cells = [row[r["criterion"]] for row in rows if row[r["criterion"]] != ""]
        passed = sum(float(c) == float(r["points"]) for c in cells)
        assert (int(r["graded"]), int(r["not_attempted"]), int(r["passed"])) == (len(cells), 1, passed), r
        assert r["pass_rate"] == f"{passed / (len(cells) - 1):.3f}"
        assert "NotImplementedError" not in r["failure_1"] + r["failure_2"] + r["failure_3"]
    by_id = {r["criterion"]: r for r in report}
    rng, loader = by_id["1.1.rng_untouched"], by_id["1.1.partition_dataset"]
    assert (rng["attempted"], rng["passed"], rng["sharing_1"]) == ("3", "2", "1") and "random" in rng["failure_1"]
    assert (loader["attempted"], loader["passed"], loader["sharing_1"]) == ("3", "2", "1")
    assert DROPS_LAST.hint in loader["likely_cause_1"]                      # the buggy submission's own cause
    (scores,) = [r for r in _rows(merged.with_name("grades_class_report_scores.csv"))[1] if r["graded"] != "0"]
    assert (scores["problem"], scores["graded"], scores["not_attempted"], scores["full_marks"]) == ("1", "4", "1", "1")
    assert float(scores["hidden_max"]) > 0 and float(scores["public_max"]) > 0
    for figure in ("grades_class_report.png", "grades_class_report_scores.png"):
        assert merged.with_name(figure).read_bytes().startswith(b"\x89PNG")
    page = (tmp_path / "similarity" / "index.html").read_text()
    assert "href='../merged/grades_class_report.html'" in page
    pairs = (tmp_path / "similarity" / "pairs.csv").read_text()
    assert "'" + FORMULA.replace('"', '""') in pairs and "\n=" not in pairs and ",=" not in pairs


def test_script_directives_parse_like_sbatch_and_bad_options_are_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("GRADING_PROBLEMS", raising=False)
    subs = tmp_path / "subs"
    for name in ("a", "b", "c"):
        _folder(subs / name, "")
    job = slurm.write_array(subs, tmp_path / "out", ["--problem", "1.1"], partition="gpu-a100", gpus_per_task=2,
                            time_limit="1-02:00:00", benchmarks=True, max_parallel=2)
    assert job.count == 3 and job.submit == f"bash {tmp_path / 'out' / slurm.SUBMIT}"
    assert slurm.check_script(job.script, 3) == []
    found = dict(slurm.directives(job.script.read_text()))
    assert found["array"] == "0-2%2" and found["time"] == "1-02:00:00" and found["partition"] == "gpu-a100"
    assert (found["cpus-per-task"], found["mem"]) == (str(DEFAULT_CPUS), DEFAULT_MEM) and "account" not in found
    assert "shared filesystem" in job.script.read_text()
    assert found["gpus-per-task"] == "2" and found["output"].endswith("/logs/task-%a.out")
    tasks = json.loads(job.tasks.read_text())
    assert tasks["benchmarks"] and tasks["limit_s"] + tasks["benchmark_limit_s"] <= 26 * 3600 - slurm.START_SLACK_S
    assert tasks["secret"] and tasks["env"] == {}
    # what sbatch would refuse is found
    bad = tmp_path / "bad.sbatch"
    bad.write_text(job.script.read_text().replace("#SBATCH --ntasks=1", "#SBATCH --ntasks=1\n#SBATCH --bogus=1\n"
                                                  "#SBATCH --array=0-5"))
    problems = slurm.check_script(bad, 3)
    assert any("--bogus" in p for p in problems) and any("2 times" in p for p in problems)
    with pytest.raises(ValueError, match="partition"):
        slurm.write_array(subs, tmp_path / "o2", partition="gpu; rm -rf /")
    with pytest.raises(ValueError, match="HH:MM:SS"):
        slurm.write_array(subs, tmp_path / "o3", time_limit="2h")
    with pytest.raises(ValueError, match="leaves"):
        slurm.write_array(subs, tmp_path / "o4", time_limit="00:02:00")
    with pytest.raises(ValueError, match="whitespace"):
        slurm.write_array(subs, tmp_path / "o 5")
    with pytest.raises(ValueError, match="--mem: not a Slurm memory size"):
        slurm.write_array(subs, tmp_path / "o6", mem="3 GB")
    with pytest.raises(ValueError, match="--cpus-per-task"):
        slurm.write_array(subs, tmp_path / "o6", cpus_per_task=0)
    with pytest.raises(ValueError, match="account"):
        slurm.write_array(subs, tmp_path / "o7", account="$(id)")
    # every resource is an option: CPUs, memory, account (and partition) go into the script as given
    parser = argparse.ArgumentParser()
    add_slurm_resource_options(parser)
    given = slurm_resources(parser.parse_args(["--cpus-per-task", "4", "--mem", "6000M", "--account", "cs-101"]))
    custom = slurm.write_array(subs, tmp_path / "o8", **given)
    assert slurm.check_script(custom.script, 3) == []
    found = dict(slurm.directives(custom.script.read_text()))
    assert (found["cpus-per-task"], found["mem"], found["account"]) == ("4", "6000M", "cs-101")
    assert "partition" not in found
    assert slurm_resources(parser.parse_args([])) == {"cpus_per_task": DEFAULT_CPUS, "mem": DEFAULT_MEM,
                                                      "account": None}
    assert slurm.array_spec([5, 0, 1, 2, 7, 8], 3) == "0-2,5,7-8%3"
    # the script refuses to run without a task id; an unknown id grades nothing
    ran = subprocess.run(["bash", str(job.script)], env={k: v for k, v in os.environ.items()
                                                         if k != "SLURM_ARRAY_TASK_ID"}, capture_output=True)
    assert ran.returncode == 2 and b"SLURM_ARRAY_TASK_ID" in ran.stderr
    assert grading_main(["batch", "--run-task", str(tmp_path / "out"), "7"]) == 2


def test_the_submit_step_refuses_another_course_secret_before_sbatch(tmp_path, monkeypatch, capsys):
    """Made without a secret, submitted with one (and the reverse, and another one): refused in one line with the
    fix, sbatch never called; the same secret: sbatch gets the script. Paths under /tmp are warned about."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    subs = tmp_path / "subs"
    _folder(subs / "a", "")
    called = tmp_path / "sbatch.args"
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/bash\necho "$@" > {called}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    job = slurm.write_array(subs, tmp_path / "plain")
    warned = capsys.readouterr().err
    assert f"warning: OUT_DIR {tmp_path / 'plain'} is under /tmp, which other nodes do not see" in warned
    assert "# WARNING: SUBMISSIONS_DIR" in job.script.read_text()
    assert json.loads(job.tasks.read_text())["secret_used"] is False
    assert f"-m grading.commands.slurm submit {tmp_path / 'plain'}" in (tmp_path / "plain" / slurm.SUBMIT).read_text()
    monkeypatch.setenv(SECRET_ENV, "term-b")
    with_secret = slurm.write_array(subs, tmp_path / "secret")
    for made, shell, fix in ((tmp_path / "plain", "term-b", f"made without a course secret but {SECRET_ENV} is set"),
                             (tmp_path / "secret", "", "made with a course secret and none is set"),
                             (tmp_path / "secret", "term-c", "differs from the one the array was made with")):
        monkeypatch.setenv(SECRET_ENV, shell)
        capsys.readouterr()
        assert slurm.submit(made) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("error: not submitted: ") and fix in err, err
        assert "make the array again" in err and not called.exists()
    monkeypatch.setenv(SECRET_ENV, "term-b")
    assert slurm.submit(tmp_path / "secret", ["--array=0"]) == 0
    assert called.read_text().split() == ["--array=0", str(with_secret.script)]


def test_submit_repeats_every_path_warning_and_without_sbatch_fails_in_one_line(tmp_path, monkeypatch, capsys):
    """The kit, the Python environment, the submissions and OUT_DIR all under /tmp: the four warnings of the
    generator come again at submit time; submit.sh with the right secret where no sbatch is on PATH says so in one
    line (no traceback) and exits 2."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv("GRADING_PYTHON", raising=False)
    _folder(tmp_path / "subs" / "a", "")
    monkeypatch.setattr(slurm, "ROOT", tmp_path / "kit")
    capsys.readouterr()
    slurm.write_array(tmp_path / "subs", tmp_path / "out", python=str(tmp_path / "venv" / "bin" / "python"))
    made = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert len(made) == 4 and all("which other nodes do not see" in line for line in made), made
    monkeypatch.setenv("PATH", str(tmp_path / "no-sbatch-here"))
    assert slurm.submit(tmp_path / "out") == 2
    err = capsys.readouterr().err.splitlines()
    assert err[:-1] == made, err
    assert err[-1].startswith("error: not submitted: no sbatch on this machine's PATH") and len(err) == 5
    monkeypatch.undo()
    monkeypatch.delenv(SECRET_ENV, raising=False)
    slurm.write_array(tmp_path / "subs", tmp_path / "real")        # the real kit: submit.sh runs it
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    done = subprocess.run(["bash", str(tmp_path / "real" / slurm.SUBMIT)], capture_output=True, text=True,
                          env={**env, "PATH": "/usr/bin:/bin", "GRADING_PYTHON": sys.executable}, timeout=120)
    lines = [line for line in done.stderr.splitlines() if not line.startswith("warning: ")]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: not submitted: no sbatch"), done.stderr


def test_collect_sorts_failed_missing_and_stale_results(tmp_path, monkeypatch, capsys):
    subs = tmp_path / "subs"
    for name in ("a", "b", "c", "d"):
        _folder(subs / name, "")
    monkeypatch.setenv("GRADING_COURSE_SECRET", "this term")
    job = slurm.write_array(subs, tmp_path / "out", max_parallel=4)
    out = job.tasks.parent
    assert "this term" not in job.tasks.read_text() + job.script.read_text()
    batch = json.loads(job.tasks.read_text())["batch"]

    def keep(name: str, task: int, status: str, token: str = batch) -> None:
        row = {"submission": name, "score": "1", "max_score": "2", "status": status, "notes": "n", "1.1.sizes": "0"}
        (out / "results" / name).mkdir(parents=True, exist_ok=True)
        (out / "results" / name / "results.json").write_text(json.dumps({"score": 1, "tests": [
            {"name": "1.1.sizes: sizes", "number": "1.1", "score": 0, "max_score": 1, "status": "failed",
             "output": "=cmd|' /C calc'!A0\nlikely cause: a formula"}]}))
        (out / "results" / name / "row.json").write_text(json.dumps({"batch": token, "task": task, "row": row}))

    keep("a", 0, "failed")
    keep("b", 1, "timeout")
    keep("c", 2, "passed", token="an earlier array")
    # d's task runs under another secret: it grades nothing, exits non-zero and says why
    monkeypatch.setenv("GRADING_COURSE_SECRET", "last term")
    wrong = _task(out, 3)
    printed = wrong.communicate()[0].decode(errors="replace")
    assert wrong.returncode == EXIT_GRADER_ERROR and "course secret differs" in printed, printed
    found = slurm.collect(out, tmp_path / "grades.csv")
    assert [t[:2] for t in found.failed] == [(1, "b"), (3, "d")] and "secret" in found.failed[1][2]
    assert [t[:2] for t in found.missing] == [(2, "c")]
    assert found.resubmit == f"bash {out / slurm.SUBMIT} --array=1-3%3"
    assert (out / "resubmit.sh").read_text().strip().endswith(found.resubmit)
    assert [row["submission"] for row in _rows(tmp_path / "grades.csv")[1]] == ["a", "b", "d"]
    d = _rows(tmp_path / "grades.csv")[1][2]
    assert d["score"] == "" and d["status"] == "grader_error" and "secret" in d["notes"]   # blank, never 0
    report = (tmp_path / "grades_class_report.csv").read_text()
    assert "'=cmd|' /C calc'!A0" in report and ",=" not in report and "a formula" in report
