"""Issue 11: a student's local grade equals the course's grade, edits outside the regions included.

A starter is released; the "student" edits it in place (region bodies, a helper at module level, an import
moved to the top of a file, a changed provided file, an extra module). ``python -m grading grade`` run in the
starter (the student's view, a command in that folder) and the kit's grader run on the same folder (the
course's view: ``grading grade SUBMISSION``, in this process) must give the same score on every public
criterion, and both must list the edits outside the regions as NOTEs.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from grading.__main__ import main as grading_main
from grading.commands.release import release
from grading.kit.course import PROBLEMS_ENV
from common import ROOT
from common.regions import parse_regions
from grading.kit.splice import replace_bodies

pytestmark = [pytest.mark.kit, pytest.mark.long_file]
DATASET, COMM = "data_parallel/dataset.py", "data_parallel/comm.py"


def _fill(starter, rel: str, body_of=None) -> None:
    """Put the kit's region bodies of ``rel`` into the starter's working file (``body_of`` overrides some)."""
    kit_regions = parse_regions((ROOT / rel).read_text(), rel)
    text = (starter / rel).read_text()
    bodies = {k: (body_of or {}).get(r.function, r.body) for k, r in enumerate(kit_regions)}
    (starter / rel).write_text(replace_bodies(text, rel, bodies))


def _read_scores(out) -> tuple[dict[str, float], list[str]]:
    """(criterion id -> score, the report's lines) of the results.json ``out``, which is then removed."""
    results = json.loads(out.read_text())
    out.unlink()
    return {t["name"].split(":")[0]: t["score"] for t in results["tests"]}, results["output"].splitlines()


def _scores(cwd, problem: str = "1") -> tuple[dict[str, float], list[str]]:
    """The student's view: ``python -m grading grade --problem PROBLEM`` run in the folder ``cwd``."""
    out = cwd / "results.json"
    done = subprocess.run([sys.executable, "-m", "grading", "grade", "--problem", problem, "--quiet", "--json",
                           str(out)], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert out.is_file(), done.stdout + done.stderr
    return _read_scores(out)


def _course_scores(submission, tmp_path, *args, problem: str = "1") -> tuple[dict[str, float], list[str]]:
    """The course's view: the kit's ``grading grade SUBMISSION --problem PROBLEM`` (in this process)."""
    out = tmp_path / "course_results.json"
    grading_main(["grade", str(submission), *args, "--problem", problem, "--quiet", "--json", str(out)])
    return _read_scores(out)


@pytest.fixture(autouse=True)
def _course_choice():
    """``--problems`` of an in-process grade sets the course's choice in this process's environment: unset
    during each test, restored after it. (Not ``monkeypatch.delenv(..., raising=False)``: for a variable that is
    not set it records nothing to undo, and the choice leaked into every later test of the process.)"""
    saved = os.environ.pop(PROBLEMS_ENV, None)
    yield
    os.environ.pop(PROBLEMS_ENV, None)
    if saved is not None:
        os.environ[PROBLEMS_ENV] = saved


@pytest.fixture(scope="module")
def edited_starter(tmp_path_factory):
    starter = tmp_path_factory.mktemp("local") / "starter"
    release(ROOT, starter)
    # partition_indices calls a helper the student put at module level (outside the regions)
    helper_body = "        return _split(size, world_size, seed)\n"
    _fill(starter, DATASET, {"partition_indices": helper_body})
    dataset = starter / DATASET
    dataset.write_text(dataset.read_text() + "\n\ndef _split(size, world_size, seed):\n"
                       "    order = list(range(size))\n    random.Random(seed).shuffle(order)\n"
                       "    base, extra = divmod(size, world_size)\n"
                       "    return [order[r * base + min(r, extra):(r + 1) * base + min(r + 1, extra)]"
                       " for r in range(world_size)]\n")
    # comm.py: average_gradients uses `math`, imported at the top of the file (outside the regions)
    _fill(starter, COMM)
    comm = starter / COMM
    text = comm.read_text().replace("param.grad.data /= world_size", "param.grad.data /= math.prod([world_size])")
    comm.write_text("import math\n" + text)
    # a provided file changed and an extra module added
    runtime = starter / "pipeline" / "runtime.py"
    runtime.write_text(runtime.read_text() + "\nDEFAULT_TIMEOUT = 1e9\n")
    (starter / "data_parallel" / "helpers.py").write_text("X = 1\n")
    return starter


def test_local_and_course_grades_agree_on_every_public_criterion(edited_starter, tmp_path):
    local, local_notes = _scores(edited_starter)
    course, course_notes = _course_scores(edited_starter, tmp_path)
    public = {cid for cid in local}
    assert public and public <= set(course)
    assert {cid: local[cid] for cid in public} == {cid: course[cid] for cid in public}
    assert local["1.1.coverage"] == 0          # the helper is not in the graded file: NameError, in both
    assert local["1.2.grads_2rank"] == 0       # `math` is not imported in the graded file: NameError, in both
    assert local["1.2.setup"] > 0 and local["1.2.train_step_updates"] > 0     # the rest of 1.2 is unaffected
    for notes in (local_notes, course_notes):
        text = "\n".join(notes)
        assert f"changed outside the student regions (ignored; the kit's text was used): {DATASET}" in text
        assert f"changed outside the student regions (ignored; the kit's text was used): {COMM}" in text
        assert "changed provided file (ignored; the kit's copy was used): pipeline/runtime.py" in text
        assert "file not in the kit (ignored; only region bodies are graded): data_parallel/helpers.py" in text


def test_the_reference_regions_score_full_public_marks_in_a_starter(tmp_path, fork_servers):
    """A starter whose regions hold the reference: every public criterion passes, graded where students grade."""
    starter = tmp_path / "starter"
    release(ROOT, starter)
    for rel in (p.relative_to(starter / "grading" / "pristine").as_posix()
                for p in (starter / "grading" / "pristine").rglob("*.py")):
        if parse_regions((ROOT / rel).read_text(), rel):
            _fill(starter, rel)
    out = tmp_path / "results.json"
    done = subprocess.run([sys.executable, "-m", "grading", "grade", "--quiet", "--json", str(out)], cwd=starter,
                          capture_output=True, text=True, timeout=900)
    results = json.loads(out.read_text())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert results["score"] == results["max_score"] > 80
    assert not any(t["visibility"] == "after_published" for t in results["tests"])     # no hidden checks here


ZERO1, LAYERS = "data_parallel/zero1.py", "tensor_parallel/layers.py"
PLANTED = {   # a region body that calls a helper the student wrote at module level, outside every region
    ZERO1: ("_flat", "        return _flatten_all(self, tensors, device)\n",
            "\n\ndef _flatten_all(optimizer, tensors, device):\n"
            "    flat = torch.zeros(optimizer.world_size * optimizer.shard_numel, dtype=torch.float32, device=device)\n"
            "    offset = 0\n"
            "    for param, tensor in zip(optimizer.params, tensors):\n"
            "        if tensor is not None:\n"
            "            flat[offset:offset + param.numel()] = tensor.reshape(-1).float()\n"
            "        offset += param.numel()\n"
            "    return flat\n"),
    LAYERS: ("backward", "        return _summed(grad, ctx.group), None\n",
             "\n\ndef _summed(grad, group):\n    grad = grad.contiguous().clone()\n"
             "    dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=group)\n    return grad\n"),
}


def _pytest_verdicts(cwd, marker: str) -> dict[str, bool]:
    """criterion id -> passed, from ``pytest -m MARKER`` run in ``cwd`` (the student's view)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-m", marker,
                           "tests/test_problems.py"], cwd=cwd, capture_output=True, text=True, timeout=900)
    found = {m.group(2): m.group(1) == "PASSED" for m in re.finditer(
        r"^(PASSED|FAILED) tests/test_problems.py::test_criterion\[(.+?)\]", done.stdout, flags=re.M)}
    assert found, done.stdout[-3000:] + done.stderr[-2000:]
    return found


def test_pytest_markers_equal_the_course_grade_for_problems_4_and_5(tmp_path):
    """Issue 19: in a starter with Problems 4 and 5, ``pytest -m p4_2`` / ``-m p5_1`` give the verdicts of
    ``grading grade --problem 4.2`` / ``5.1``, criterion by criterion, for regions that call a module-level helper
    (absent from the graded copy, so both fail the same criteria)."""
    starter = tmp_path / "starter"
    release(ROOT, starter, ("1", "2", "3", "4", "5"))
    for rel, (function, body, helper) in PLANTED.items():
        kit_regions = parse_regions((ROOT / rel).read_text(), rel)
        text = (starter / rel).read_text()
        planted = [k for k, r in enumerate(kit_regions) if r.function == function][:1]
        bodies = {k: body if k in planted else r.body for k, r in enumerate(kit_regions)}
        (starter / rel).write_text(replace_bodies(text, rel, bodies) + helper)
    local = _pytest_verdicts(starter, "p4_2 or p5_1")                # one pytest run, both markers
    for problem in ("4.2", "5.1"):
        course, _ = _course_scores(starter, tmp_path, "--problems", "1,2,3,4,5", problem=problem)
        public = {cid: score > 0 for cid, score in course.items() if not cid.endswith("_hidden")}
        mine = {cid: passed for cid, passed in local.items() if cid.startswith(problem + ".")}
        assert mine == public, (problem, mine, public)
        assert not all(mine.values()), (problem, mine)        # the missing helper costs criteria, in both views
