"""The student handout: the starter's README, assembled at release time for the course's chosen problems.

Staff only (``grading/staff`` is never released). The parts:

    grading/staff/README.student.md   the common part: what to fill in, running the code, grading, submitting
    handout/problem<N>.md             one section per problem: background, figure, sub-problems and points,
                                      markers, entry points (what they print, how long), expectations
    handout/faq.md                    hand-written FAQ entries (faq.py adds the generated ones)
    handout/figures.py                the plain-text figures      handout/rubric.py   points from the rubric

Templates hold ``{{name}}`` placeholders, filled here from the kit itself:
the points from ``grading.problems.all_cases`` (as ``grading list`` sums
them), the markers from the sub-problem ids, the performance thresholds
from the defaults of ``scripts/run_benchmarks.py``, the figure names from
``grading.kit.handin``. A placeholder left unfilled is an error.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from grading.kit.course import DEFAULT_PROBLEMS
from grading.kit.handin import FIGURES_DIR, REQUIRED_FIGURES, SUMMARY_NAME
from grading.kit.regions import student_files
from grading.staff.handout import faq, figures
from grading.staff.handout.rubric import marker, markers_line, points_table, problem_points, sub_points

HANDOUT_DIR = Path(__file__).resolve().parent
COMMON_TEMPLATE = HANDOUT_DIR.parent / "README.student.md"
BENCHMARK_SCRIPT = "scripts/run_benchmarks.py"
THRESHOLD_OPTIONS = ("--dp_threshold", "--pp_threshold")
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def problem_template(problem: str) -> Path:
    """The template of Problem ``problem``'s section (``handout/problem<N>.md``)."""
    return HANDOUT_DIR / f"problem{problem}.md"


def thresholds(kit_root: Path) -> dict[str, float]:
    """The course's performance thresholds: the defaults of ``--dp_threshold`` and ``--pp_threshold`` in
    ``scripts/run_benchmarks.py`` (read with ``ast``, never imported). Raises ValueError when one is missing."""
    tree = ast.parse((Path(kit_root) / BENCHMARK_SCRIPT).read_text())
    found: dict[str, float] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args:
            name = getattr(node.args[0], "value", None)
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            if name in THRESHOLD_OPTIONS and isinstance(default, ast.Constant):
                found[name.removeprefix("--")] = float(default.value)
    missing = [o for o in THRESHOLD_OPTIONS if o.removeprefix("--") not in found]
    if missing:
        raise ValueError(f"{BENCHMARK_SCRIPT}: no default for {', '.join(missing)}")
    return found


def fill(template: str, values: dict[str, str], where: str) -> str:
    """``template`` with every ``{{name}}`` replaced by ``values[name]``; ValueError naming an unknown one."""
    unknown = sorted({m.group(1) for m in _PLACEHOLDER.finditer(template)} - set(values))
    if unknown:
        raise ValueError(f"{where}: unknown placeholder(s) {', '.join('{{' + u + '}}' for u in unknown)}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _overview(problems: tuple[str, ...], rows: dict) -> str:
    """The opening lines: which problems, their points, and what the extra ones are."""
    total, hidden = sum(r.points for r in rows.values()), sum(r.hidden for r in rows.values())
    lines = [f"This assignment has Problem{'s' if len(problems) > 1 else ''} {_and(list(problems))}: "
             f"{total:g} points in all, {hidden:g} of them on hidden checks."]
    extra = [p for p in problems if p not in DEFAULT_PROBLEMS]
    if extra:
        lines.append(f"Problem{'s' if len(extra) > 1 else ''} {_and(extra)} go{'es' if len(extra) == 1 else ''} "
                     "beyond the usual assignment (Problems 1-3); your course hands "
                     f"{'it' if len(extra) == 1 else 'them'} out too, and its staff say how "
                     f"{'it counts' if len(extra) == 1 else 'they count'}.")
    table = ["| problem | points | of them hidden |", "|---|---|---|"]
    for problem in problems:
        points, secret = problem_points(rows, problem)
        table.append(f"| Problem {problem} | {points:g} | {secret:g} |")
    table.append(f"| **total** | **{total:g}** | **{hidden:g}** |")
    return " ".join(lines) + "\n\n" + "\n".join(table)


def render(kit_root: Path, problems: tuple[str, ...], problem_table: str) -> str:
    """The handout for ``problems`` (sorted, e.g. ("1", "2", "3")) with ``problem_table`` (the regions' table).

    Raises ValueError for a placeholder no value fills, or a problem without a template.
    """
    kit_root = Path(kit_root)
    problems = tuple(sorted(problems, key=int))
    rows = sub_points(problems)
    limits = thresholds(kit_root)
    shared = {"gpipe_figure": figures.gpipe_schedule(4, 3), "bubble_table": figures.bubble_table(),
              "zero_table": figures.zero_memory_table(), "zero1_figure": figures.zero1_shards(),
              "tp_figure": figures.tensor_splits(), "dp_threshold": f"{limits['dp_threshold']:g}",
              "pp_threshold": f"{limits['pp_threshold']:g}"}
    sections = []
    for problem in problems:
        template = problem_template(problem)
        if not template.is_file():
            raise ValueError(f"no handout section for Problem {problem} ({template.name} missing)")
        points, hidden = problem_points(rows, problem)
        values = shared | {"points": f"{points:g}", "hidden": f"{hidden:g}",
                           "points_table": points_table(rows, problem), "markers": markers_line(rows, problem)}
        sections.append(fill(template.read_text(), values, template.name).strip())
    common = {"overview": _overview(problems, rows), "problem_table": problem_table,
              "problem_sections": "\n\n".join(sections),
              "all_markers": " ".join(marker(r) for r in rows), "first_marker": marker(next(iter(rows))),
              "figures_dir": FIGURES_DIR, "figures": ", ".join(f"`{n}`" for n in REQUIRED_FIGURES),
              "summary_name": SUMMARY_NAME, "faq": faq.render(list(rows), student_files(kit_root, problems))}
    return fill(COMMON_TEMPLATE.read_text(), common, COMMON_TEMPLATE.name).strip() + "\n"
