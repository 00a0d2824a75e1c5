"""``python -m grading``: end to end on the reference, the released starter, zips and tampered submissions."""
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import psutil
import pytest

from grading.engine.run_servers import POOL_ENV, ForkServers
from grading.engine.runner import FORKSERVER_ENV
from grading.kit.course import DEFAULT_PROBLEMS
from common import ROOT
from common.regions import student_files
from grading.commands.release import release
from tests.commands import run_kit_command
from grading.kit.variants import with_body

pytestmark = pytest.mark.kit


def grade(*args, cwd=ROOT):
    """``python -m grading grade --quiet ARGS`` in ``cwd``, as ``batch`` starts it (``tests/commands.py``)."""
    return run_kit_command(["grade", "--quiet", *args], cwd=cwd, timeout=900)


@pytest.fixture(scope="module")
def starter(tmp_path_factory):
    out = tmp_path_factory.mktemp("starter") / "s"
    release(ROOT, out)
    return out


def test_reference_scores_full_marks_on_problem_1_1(tmp_path):
    """The command line end to end in a new interpreter (its own fork servers); every criterion's grade on the
    reference is tests/test_problems.py's."""
    done = subprocess.run([sys.executable, "-m", "grading", "grade", "--quiet", "--problem", "1.1", "--json",
                           str(tmp_path / "r.json")], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={k: v for k, v in os.environ.items() if k != POOL_ENV})
                                                    # a new interpreter, as a student starts it (no pool)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["score"] == results["max_score"] > 0
    assert {t["status"] for t in results["tests"]} == {"passed"}
    for test in results["tests"]:
        assert set(test) >= {"name", "score", "max_score", "status", "output", "visibility"}
    assert "TOTAL" in done.stdout


def test_released_starter_scores_zero_everywhere_with_not_implemented(starter, tmp_path):
    done = grade(starter, "--json", tmp_path / "r.json")
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert done.returncode == 3, done.stdout + done.stderr        # incomplete, not a grader crash
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["max_score"] > 0 and results["score"] == 0
    problems = {t["number"] for t in results["tests"]}
    assert {"1.1", "1.2"} <= problems
    for test in results["tests"]:
        assert test["score"] == 0
        assert f"Problem {test['number']}" in test["output"] and "NotImplementedError" in test["output"], test


def test_students_own_grader_in_the_starter_runs(starter):
    done = grade("--problem", "1.1", cwd=starter)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "TOTAL 0/" in done.stdout


def _submission_from(starter, tmp_path, fill_from_kit=("data_parallel/dataset.py",)):
    sub = tmp_path / "sub"
    for rel in student_files(ROOT, DEFAULT_PROBLEMS):
        source = ROOT / rel if rel in fill_from_kit else starter / rel
        (sub / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, sub / rel)
    return sub


def test_zip_submission_wrapped_in_a_folder_is_graded(starter, tmp_path):
    sub = _submission_from(starter, tmp_path)
    archive = tmp_path / "submission.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for file in sub.rglob("*.py"):
            z.write(file, "my_work/" + file.relative_to(sub).as_posix())
    done = grade(archive, "--problem", "1.1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"TOTAL (\d+)/\1\b", done.stdout), done.stdout


def test_edits_outside_regions_are_reported_and_ignored(starter, tmp_path):
    sub = _submission_from(starter, tmp_path)
    target = sub / "data_parallel" / "dataset.py"
    target.write_text(target.read_text().replace("DEFAULT_SEED = 1234", "DEFAULT_SEED = 99\nHACKED = True"))
    done = grade(sub, "--problem", "1.1", "--json", tmp_path / "r.json")
    assert "changed outside the student regions (ignored; the kit's text was used): data_parallel/dataset.py" \
        in done.stdout
    assert done.returncode == 0, done.stdout
    assert "data_parallel/dataset.py" in json.loads((tmp_path / "r.json").read_text())["output"]


def test_malformed_markers_in_a_submission_cost_only_that_file(starter, tmp_path):
    sub = _submission_from(starter, tmp_path, fill_from_kit=("data_parallel/dataset.py", "data_parallel/comm.py"))
    target = sub / "data_parallel" / "comm.py"
    target.write_text(target.read_text().replace("# END_STUDENT 1.2", "", 1))
    done = grade(sub, "--problem", "1")
    assert "malformed markers (file graded as not implemented): data_parallel/comm.py" in done.stdout
    assert re.search(r"Problem 1\.1 .*\n\s*\[(\d+)/\1 public", done.stdout) and "[0/" in done.stdout, done.stdout


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing", "no such file or folder"),
    (lambda p: (p / "empty").mkdir() or p / "empty", "no student file found"),
])
def test_bad_submission_paths_get_a_clear_error(tmp_path, make, message):
    done = grade(make(tmp_path))
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_zip_slip_is_rejected(tmp_path):
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("../../escape.py", "x = 1")
    done = grade(archive)
    assert done.returncode == 2 and "unsafe path" in done.stderr


def test_the_default_table_wraps_the_likely_cause_instead_of_cutting_it(tmp_path, fork_servers):
    from grading.commands import report
    from grading.commands.variants import declared, grade_group
    variant = next(v for v in declared("1.2") if v.name == "sum_without_dividing")
    table = report.table(list(grade_group((variant,), tmp_path, fork_servers).values()))
    assert "likely cause: a sum without the division by the world size (every gradient is 2 x the expected one)" \
        in " ".join(line.strip() for line in table.splitlines()), table
    assert "…" not in table and max(len(line) for line in table.splitlines()) <= 160, table
    assert "5 of 5 entries differ: fc1.weight, fc1.bias, fc2.weight, fc2.bias, frozen.weight" in \
        " ".join(line.strip() for line in table.splitlines())


@pytest.fixture
def pool_env(fork_servers):
    """This process's environment naming a pool of fork servers (the session's, else new ones), warm ranks on."""
    with contextlib.ExitStack() as stack:
        servers = fork_servers or stack.enter_context(ForkServers(ROOT))
        env = {k: v for k, v in os.environ.items() if k != FORKSERVER_ENV}
        yield {**env, **servers.pool_env()}


def test_a_grade_named_a_pool_is_forked_by_its_server(tmp_path, pool_env):
    """Where ``GRADING_FORKSERVER_POOL`` names fork servers (``batch``, this suite), ``python -m grading grade`` has
    one of them fork the grade, with the libraries it holds, in this process's folder, environment and streams, and
    exits with the grade's code (a usage error's too). Here the process itself cannot import torch, so a grade that
    ran in it fails: without the pool it does."""
    no_torch = tmp_path / "no_torch"
    no_torch.mkdir()
    (no_torch / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None     # import torch fails\n")
    env = {**pool_env, "PYTHONPATH": str(no_torch)}
    done = run_kit_command(["grade", "--quiet", "--problem", "1.1", "--json", tmp_path / "r.json"], env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["score"] == results["max_score"] > 0 and "TOTAL" in done.stdout
    usage = run_kit_command(["grade", "--no-such-option"], env=env)
    assert usage.returncode == 2 and "unrecognized arguments: --no-such-option" in usage.stderr, usage.stderr
    cold = run_kit_command(["grade", "--quiet", "--problem", "1.1"],
                           env={k: v for k, v in env.items() if k != POOL_ENV})
    assert cold.returncode != 0 and "torch" in cold.stdout + cold.stderr


def test_a_forked_grade_stopped_through_its_process_cleans_up_as_a_new_interpreter_does(tmp_path, pool_env):
    """SIGTERM to the ``grade`` process (``batch`` at ^C, ``scancel``) reaches the grade the pool's server forked:
    it stops its ranks, removes its temporary folders and exits 143, as a grade in its own interpreter does;
    nothing of it is left running."""
    dataset = "data_parallel/dataset.py"
    (tmp_path / "sub" / "data_parallel").mkdir(parents=True)
    (tmp_path / "sub" / dataset).write_text(with_body((ROOT / dataset).read_text(), dataset, "partition_indices",
                                                      "import time\nwhile True:\n    time.sleep(0.1)\n"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "grading", "grade", str(tmp_path / "sub"), "--problem", "1.1",
                             "--quiet", "--timeout", "300"], cwd=ROOT, env={**pool_env, "TMPDIR": str(scratch)},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while not list(scratch.glob("grading-*/runs/*/rank0")) and time.monotonic() < deadline:   # its ranks started
            time.sleep(0.2)
        assert list(scratch.glob("grading-*/runs/*/rank0")), "the grade never started its ranks"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, (out, err)
    assert not list(scratch.iterdir()), list(scratch.iterdir())
    left = []                                  # its ranks ran in its grading copy there
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.cwd().startswith(str(scratch)):
                left.append(process)
    assert not left, left
