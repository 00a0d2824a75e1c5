"""A student exception is reported with its file and line in every sub-problem (issue 21, item 5).

One copy of the kit carries a planted ``raise IndexError(...)`` as the first statement of one region of
each of the 13 sub-problems; every problem is graded once on it (each sub-problem through its own cases).
For each sub-problem, some failed criterion's message must name the planted region's file and a line
inside that region (``hints.describe_exception`` / ``case_run.describe_error``: "(at path:line (in fn))"),
whether ``ctx.record`` caught the exception or a probe helper did (``call_outcome``, ``labelled``, a
probe's own ``except``).
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from grading import KIT_ROOT
from grading.engine.runner import run_cases
from grading.kit.course import PROBLEMS_ENV
from grading.kit.regions import parse_regions, replace_bodies
from grading.kit.submission import build_grading_copy
from grading.problems import all_cases, folders
from tests.kit.variants import make_variant_kit

pytestmark = pytest.mark.kit

# sub-problem -> (file, function of the planted region, which of that function's regions in the file)
PLANTS = {
    "1.1": ("data_parallel/dataset.py", "partition_indices", 0),
    "1.2": ("data_parallel/comm.py", "average_gradients", 0),
    "2.1": ("pipeline/schedule.py", "clock_cycles", 0),
    "2.2": ("pipeline/pipe.py", "forward", 0),
    "2.3": ("pipeline/gpt2.py", "gpt2_stages", 0),
    "3.1": ("finetune/lora.py", "apply_lora", 0),
    "3.2": ("finetune/lora.py", "load_adapter", 0),
    "3.3": ("finetune/zero.py", "train_microbatch", 0),
    "4.1": ("data_parallel/ddp.py", "__init__", 0),
    "4.2": ("data_parallel/zero1.py", "step", 0),
    "4.3": ("data_parallel/checkpoint.py", "save_sharded", 0),
    "5.1": ("tensor_parallel/layers.py", "from_linear", 0),        # ColumnParallelLinear.from_linear
    "5.2": ("tensor_parallel/gpt2.py", "parallelize_block", 0),
}
# Sub-problems whose probes still format a caught exception by hand (other folders' owners): none known today.
HAND_FORMATTED: dict[str, str] = {}


def _plant(kit: Path, sub: str) -> None:
    """Make ``raise IndexError("planted in <sub>")`` the first statement of ``sub``'s planted region."""
    path, function, nth = PLANTS[sub]
    text = (kit / path).read_text()
    regions = parse_regions(text, path)
    index = [k for k, r in enumerate(regions) if r.function == function][nth]
    body = textwrap.dedent(regions[index].body)
    new_body = textwrap.indent(f'raise IndexError("planted in {sub}")\n' + body, regions[index].indent)
    (kit / path).write_text(replace_bodies(text, path, {index: new_body}))


def _planted_lines(graded: Path, sub: str) -> range:
    """The file lines of ``sub``'s planted region in the graded copy."""
    path, function, nth = PLANTS[sub]
    region = [r for r in parse_regions((graded / path).read_text(), path) if r.function == function][nth]
    return range(region.begin_line + 1, region.end_line)


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> tuple[Path, dict]:
    """Every sub-problem graded once on a kit with all the planted raises; (graded copy, verdicts by problem)."""
    work = tmp_path_factory.mktemp("exception_locations")
    kit = make_variant_kit(work / "kit", [])
    for sub in PLANTS:
        _plant(kit, sub)
    problems = tuple(sorted({sub.split(".")[0] for sub in PLANTS}))
    by_problem: dict[str, list] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(PROBLEMS_ENV, ",".join(problems))          # splice the optional problems' regions too
        splice = build_grading_copy(KIT_ROOT, kit, work / "graded")
        for verdict in run_cases(all_cases(problems), work / "graded", work / "runs", barred=splice.barred,
                                 hints=splice.hints):
            by_problem.setdefault(verdict.problem, []).append(verdict)
    return work / "graded", by_problem


def test_every_sub_problem_has_a_planted_region():
    assert set(PLANTS) == set(folders()), "plant a raise in every sub-problem's region"


@pytest.mark.parametrize("sub", [
    pytest.param(sub, marks=pytest.mark.xfail(strict=True, reason=HAND_FORMATTED[sub]))
    if sub in HAND_FORMATTED else sub for sub in PLANTS])
def test_the_failure_names_the_file_and_line_inside_the_region(sub, graded):
    root, by_problem = graded
    path = PLANTS[sub][0]
    lines = _planted_lines(root, sub)
    verdicts = by_problem.get(sub, [])
    failed = [v for v in verdicts if not v.passed]
    assert failed, f"{sub}: no criterion failed with a raise in {path}"
    found = [(v.id, int(n)) for v in failed for n in re.findall(rf"\(at {re.escape(path)}:(\d+) \(in ", v.message)]
    inside = [(cid, n) for cid, n in found if n in lines]
    assert inside, (f"{sub}: no failure message names {path}:<line in {lines.start}..{lines.stop - 1}> "
                    f"(found {found[:5]}):\n" + "\n".join(f"{v.id}: {v.message[:300]}" for v in failed))
