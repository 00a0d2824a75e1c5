"""The student handout: the starter's README, assembled at release time for the course's chosen problems.

Its templates (``grading/staff/README.student.md``; here ``problem<N>.md``, ``faq.md``, ``primer.md``,
``analysis.md``) hold ``{{name}}`` placeholders, filled from the kit itself: the points from the rubric as
``grading.kit.points`` states them, the markers from the sub-problem ids, the performance thresholds from
``scripts/run_benchmarks.py``, the figure names from ``common.handin``.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from grading.kit import points
from grading.kit.course import DEFAULT_PROBLEMS
from common.rank_watch import PROGRESS_S, STILL_LIMIT_S
from common.handin import ANALYSIS_NAME, FIGURES_DIR, REQUIRED_FIGURES, SUMMARY_NAME
from common.regions import student_files
from grading.staff.handout import analysis, faq, figures, plan
from grading.staff.handout.rubric import marker, markers_line, points_table, problem_points, sub_points

HANDOUT_DIR = Path(__file__).resolve().parent
COMMON_TEMPLATE = HANDOUT_DIR.parent / "README.student.md"
PRIMER_TEMPLATE = HANDOUT_DIR / "primer.md"
EXAMPLE = "scripts/two_ranks.py"        # the primer's runnable example, shipped in every starter
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


def usual_assignment() -> str:
    """The default assignment in words: "Problems 1-3" (``DEFAULT_PROBLEMS``)."""
    first, last = DEFAULT_PROBLEMS[0], DEFAULT_PROBLEMS[-1]
    return f"Problem {first}" if first == last else f"Problems {first}-{last}"


def _overview(problems: tuple[str, ...], rows: dict, analysis_points: float) -> str:
    """The opening lines: which problems, their points (stated as ``grading.kit.points`` states them), what the
    problems beyond the default assignment mean for the student, and how the written analysis counts."""
    lines = [f"This assignment has Problem{'s' if len(problems) > 1 else ''} {_and(list(problems))}: "
             f"{problem_points(rows)}."]
    extra = [p for p in problems if p not in DEFAULT_PROBLEMS]
    if extra:
        worth = problem_points({k: row for k, row in rows.items() if row.problem in extra})
        one = len(extra) == 1
        lines.append(f"Problem{'' if one else 's'} {_and(extra)} go{'es' if one else ''} beyond the usual assignment "
                     f"({usual_assignment()}) and your course hands {'it' if one else 'them'} out, so "
                     f"{'it counts' if one else 'they count'} toward your grade like the others: "
                     f"{points.count(worth.public, 'public')} + {points.count(worth.hidden, 'hidden')} of the total "
                     "above.")
    lines.append("You also hand in a written analysis (see \"Written analysis\"). "
                 + analysis.points_sentence(analysis_points))
    table = ["| problem | public points | hidden points (the course adds them when it grades) | in all |",
             "|---|---|---|---|"]
    for problem in problems:
        tally = problem_points(rows, problem)
        table.append(f"| Problem {problem} | {tally.public:g} | {tally.hidden:g} | {tally.public + tally.hidden:g} |")
    total = problem_points(rows)
    table.append(f"| **total** | **{total.public:g}** | **{total.hidden:g}** | **{total.public + total.hidden:g}** |")
    return " ".join(lines) + "\n\n" + "\n".join(table)


def primer(kit_root: Path) -> str:
    """The torch.distributed primer (``primer.md``) with the starter's runnable example shown in full."""
    source = (Path(kit_root) / EXAMPLE).read_text()
    code = source.split('"""', 2)[2].strip() if source.startswith('"""') else source.strip()
    text = re.sub(r"<!--.*?-->", "", PRIMER_TEMPLATE.read_text(), flags=re.DOTALL).strip()
    return fill(text, {"example": code, "example_path": EXAMPLE, "progress_s": f"{PROGRESS_S:g}",
                       "still_limit_s": f"{STILL_LIMIT_S:g}"}, PRIMER_TEMPLATE.name)


def render(kit_root: Path, problems: tuple[str, ...], problem_table: str, analysis_points: float = 0.0) -> str:
    """The handout for ``problems`` (sorted, e.g. ("1", "2", "3")) with ``problem_table`` (the regions' table);
    ``analysis_points``: what the course gives the written analysis (0: ungraded unless the staff say so).

    Raises ValueError for a placeholder no value fills, or a problem without a template, plan or questions.
    """
    kit_root = Path(kit_root)
    problems = tuple(sorted(problems, key=int))
    rows = sub_points(problems)
    limits = thresholds(kit_root)
    every_problem = {"gpipe_figure": figures.gpipe_schedule(4, 3), "bubble_table": figures.bubble_table(),
                     "zero_table": figures.zero_memory_table(), "zero1_figure": figures.zero1_shards(),
                     "tp_figure": figures.tensor_splits(), "dp_threshold": f"{limits['dp_threshold']:g}",
                     "pp_threshold": f"{limits['pp_threshold']:g}"}
    sections = []
    for problem in problems:
        template = problem_template(problem)
        if not template.is_file():
            raise ValueError(f"no handout section for Problem {problem} ({template.name} missing)")
        values = every_problem | {"points": str(problem_points(rows, problem)), "plan": plan.line(problem),
                           "points_table": points_table(rows, problem), "markers": markers_line(rows, problem)}
        sections.append(fill(template.read_text(), values, template.name).strip())
    first = problems[0]
    example = points.Tally(problem_points(rows, first).public, problem_points(rows, first).hidden, earned=0.0)
    common = {"overview": _overview(problems, rows, analysis_points), "problem_table": problem_table,
              "problem_sections": "\n\n".join(sections), "plan_table": plan.table(problems),
              "primer": primer(kit_root), "analysis": analysis.section(problems, analysis_points),
              "analysis_name": ANALYSIS_NAME, "points_example": f"TOTAL {example}", "first_problem": first,
              "all_markers": " ".join(marker(r) for r in rows), "first_marker": marker(next(iter(rows))),
              "figures_dir": FIGURES_DIR, "figures": ", ".join(f"`{n}`" for n in REQUIRED_FIGURES),
              "summary_name": SUMMARY_NAME, "faq": faq.render(list(rows), student_files(kit_root, problems))}
    return fill(COMMON_TEMPLATE.read_text(), common, COMMON_TEMPLATE.name).strip() + "\n"
