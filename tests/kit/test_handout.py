"""The released README is a handout for the course's chosen problems (issues 21 and 38).

Two releases per module (all five problems with a preface and analysis
points, and the default), read back: a section per chosen problem, the points
of every sub-problem as the rubric sums them, stated as ``grading list``
states them (public, then hidden, each noun agreeing with its number), the
markers and entry points of the optional problems only where chosen, the preface first, a bad preface or bad analysis
points refused before anything is written; the torch.distributed primer with
its example, run for real (gloo, 2 processes); what to observe per problem;
the suggested order and time; the written analysis in the README, as the
starter's template and in the starter's submission zip. Nothing is graded here.
No problem number, marker quoting, plural or section wording is held here by hand: each is derived from the
kit (its folders, ``DEFAULT_PROBLEMS``, ``OPTIONAL_FILES``, ``grading.kit.points``, ``plan``), so that
tests/kit/test_adding_a_subproblem.py can run these tests on a kit with a new problem.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from common import ROOT
from grading.__main__ import main
from grading.commands.release import OPTIONAL_FILES
from common import error_words
from grading.kit import points
from grading.kit.course import DEFAULT_PROBLEMS, is_example, present_problems
from common.handin import ANALYSIS_NAME, ANSWER_PLACEHOLDER, FIGURES_DIR
from common.regions import parse_regions, student_files
from grading.problems import all_cases, folders
from grading.staff import handout
from grading.staff.handout import analysis, faq, figures, plan, usual_assignment
from grading.staff.handout.rubric import marker
from tests.commands import run_kit_command

pytestmark = [pytest.mark.kit, pytest.mark.long_file]

ALL = tuple(p for p in present_problems() if not is_example(p))      # every problem a course may hand out
OPTIONAL = tuple(p for p in ALL if p not in DEFAULT_PROBLEMS)         # those beyond the default assignment
PREFACE = "# CS 11-868, Spring 2026\n\nDue May 1, 23:59. Late days: see the syllabus.\n"
# an optional problem's entry points: the project/run_*.py among its OPTIONAL_FILES
ENTRY_POINTS = {p: tuple(f for f in OPTIONAL_FILES.get(p, ()) if f.startswith("project/run_")) for p in OPTIONAL}
ANALYSIS_POINTS = 10
EXAMPLE = "scripts/two_ranks.py"


def _release(tmp_path_factory, name: str, *args: str) -> Path:
    out = tmp_path_factory.mktemp(name) / "starter"
    assert main(["release", str(out), *args]) == 0
    return out


@pytest.fixture(scope="module")
def everything_starter(tmp_path_factory) -> Path:
    preface = tmp_path_factory.mktemp("preface") / "preface.md"
    preface.write_text(PREFACE)
    return _release(tmp_path_factory, "all", "--problems", ",".join(ALL), "--preface", str(preface),
                    "--analysis_points", str(ANALYSIS_POINTS))


@pytest.fixture(scope="module")
def default_starter(tmp_path_factory) -> Path:
    return _release(tmp_path_factory, "default")


@pytest.fixture(scope="module")
def everything(everything_starter) -> str:
    return (everything_starter / "README.md").read_text()


@pytest.fixture(scope="module")
def default(default_starter) -> str:
    return (default_starter / "README.md").read_text()


def _sections(text: str) -> dict[str, str]:
    """Problem number -> the text of its ``## Problem N: ...`` section (up to the next ``## ``)."""
    found = {}
    for match in re.finditer(r"^## Problem (\d+): .*?(?=^## )", text, flags=re.MULTILINE | re.DOTALL):
        found[match.group(1)] = match.group(0)
    return found


def _rubric(problems: tuple[str, ...]) -> dict[str, tuple[float, float]]:
    """Sub-problem -> (public points, hidden points), summed from the kit's criteria (hidden ones included)."""
    sums: dict[str, list[float]] = {}
    for case in all_cases(problems):
        for criterion in case.criteria:
            entry = sums.setdefault(criterion.problem, [0.0, 0.0])
            entry[1 if criterion.hidden else 0] += criterion.points
    return {sub: (public, hidden) for sub, (public, hidden) in sums.items()}


def _points_rows(section: str) -> dict[str, tuple[float, float]]:
    """Sub-problem -> (public points, hidden points) as the section's points table gives them."""
    rows = re.findall(r"^\| (\d+\.\d+) \| [^|]+ \| ([\d.]+) \| ([\d.]+) \|", section, flags=re.MULTILINE)
    return {sub: (float(public), float(hidden)) for sub, public, hidden in rows}


@pytest.mark.parametrize("which", ["everything", "default"])
def test_a_section_per_chosen_problem_with_the_rubric_points(which, request):
    text = request.getfixturevalue(which)
    problems = ALL if which == "everything" else DEFAULT_PROBLEMS
    sections = _sections(text)
    assert list(sections) == list(problems)
    rubric = _rubric(problems)
    for problem, section in sections.items():
        mine = {sub: pts for sub, pts in rubric.items() if sub.split(".")[0] == problem}
        assert _points_rows(section) == mine, f"Problem {problem}: README points differ from the rubric"
        public, hidden = sum(p for p, _ in mine.values()), sum(h for _, h in mine.values())
        assert section.startswith(f"## Problem {problem}: ")
        assert section.splitlines()[2] == f"**Points:** {points.Tally(public, hidden)}."
        assert f"**Problem {problem}** | | **{public:g}** | **{hidden:g}** |" in section
        for part in ("what it is", "why it matters"):
            assert part in section.lower(), f"Problem {problem}: no background ({part!r})"
        assert "```" in section, f"Problem {problem}: no figure"
    public, hidden = sum(p for p, _ in rubric.values()), sum(h for _, h in rubric.values())
    assert f"| **total** | **{public:g}** | **{hidden:g}** | **{public + hidden:g}** |" in text
    overview = re.search(r"^This assignment has Problems [\d, and]+: (.*?)\.(?: |$)", text, flags=re.MULTILINE)
    assert overview and overview.group(1) == str(points.Tally(public, hidden)), overview


def test_default_release_mentions_no_optional_problem(default):
    total = points.worth([c for case in all_cases(DEFAULT_PROBLEMS) for c in case.criteria])
    assert f"| **total** | **{total.public:g}** | **{total.hidden:g}** | **{total.public + total.hidden:g}** |" \
        in default
    words = [w for p in OPTIONAL for w in (f"Problem {p}", marker(f"{p}."))]                 # "Problem 4", "p4_"
    words += [Path(f).name for p in OPTIONAL for f in OPTIONAL_FILES.get(p, ()) if "*" not in f]   # their files
    for word in (*words, "tensor_parallel", "BucketedDDP", "ShardedOptimizer", "--problems", "optional"):
        number_ends = r"(?!\d)" if word[-1].isdigit() else ""                                  # not "Problem 40"
        assert not re.search(re.escape(word) + number_ends, default), f"the default handout mentions {word!r}"


def _pytest_markers(section: str) -> list[set[str]]:
    """The markers each ``python -m pytest -m SELECTOR`` command of ``section`` selects (quoted or not)."""
    found = []
    for line in section.splitlines():
        words = shlex.split(line.split("  #")[0]) if "python -m pytest -m " in line else []
        if words[:4] == ["python", "-m", "pytest", "-m"] and len(words) > 4:
            found.append(set(re.findall(r"\w+", words[4])) - {"or", "and", "not"})
    return found


def test_markers_and_entry_points_of_optional_problems_only_in_their_sections(everything):
    sections = _sections(everything)
    for problem in ALL:
        subs = [sub for sub in _rubric(ALL) if sub.split(".")[0] == problem]
        marks = [marker(sub) for sub in subs]
        assert set(marks) in _pytest_markers(sections[problem]), \
            f"Problem {problem}: no `python -m pytest -m ...` selecting exactly {marks}"
        for mark in marks:
            assert mark in everything.split("## How grading works")[1].splitlines()[2]   # the list of markers
    for problem, entry_points in ENTRY_POINTS.items():
        for entry in entry_points:
            holders = [p for p, text in sections.items() if entry in text]
            assert holders == [problem], f"{entry} appears in the sections of Problems {holders}"


def test_preface_comes_first(everything):
    assert everything.startswith(PREFACE.rstrip() + "\n\n# Assignment 5")


@pytest.mark.parametrize("kind", ["missing", "folder", "empty", "binary"])
def test_a_bad_preface_is_refused_in_one_line_and_nothing_written(kind, tmp_path, capsys):
    preface = tmp_path / "preface.md"
    if kind == "folder":
        preface.mkdir()
    elif kind == "empty":
        preface.write_text(" \n")
    elif kind == "binary":
        preface.write_bytes(b"\xff\xfe\x00course")
    out = tmp_path / "starter"
    assert main(["release", str(out), "--preface", str(preface)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: --preface {preface}"), err
    assert not out.exists()


def test_performance_thresholds_are_the_benchmark_defaults(everything):
    spec = importlib.util.spec_from_file_location("run_benchmarks_defaults", ROOT / "scripts/run_benchmarks.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    defaults = script.parse_args([])
    assert handout.thresholds(ROOT) == {"dp_threshold": defaults.dp_threshold,
                                        "pp_threshold": defaults.pp_threshold}
    sections = _sections(everything)
    assert f"**{defaults.dp_threshold:g}x**" in sections["1"]
    assert f"**{defaults.pp_threshold:g}x**" in sections["2"]


def test_faq_holds_every_exception_hint_and_a_section_per_folder_with_likely_causes(everything):
    faq_text = everything.split("## FAQ")[1]
    for _, _, hint in error_words.EXCEPTION_HINTS:
        assert hint in faq_text
    assert "likely cause: a late-binding closure at pipeline/pipe.py:" in faq_text
    written = faq.sections()
    for sub, package in folders().items():
        folder = Path(package.__file__).parent
        if any("likely cause:" in (folder / name).read_text() for name in ("checks.py", "hints.py")
               if (folder / name).is_file()):
            assert sub in written and written[sub], f"{folder.name} prints likely causes: give it their entries " \
                                                    f"in {folder.name}/{faq.FOLDER_FAQ}"


def test_gpipe_figure_follows_the_schedule_contract():
    lines = figures.gpipe_schedule(4, 3).splitlines()
    waves = [line for line in lines if line.startswith("cycle ")]
    assert len(waves) == 4 + 3 - 1
    for k, line in enumerate(waves):
        want = [(k - j, j) for j in range(3) if 0 <= k - j < 4]
        assert line == f"cycle {k}: [" + ", ".join(f"({i}, {j})" for i, j in want) + "]"


def test_a_placeholder_without_a_value_is_refused():
    with pytest.raises(ValueError, match=r"unknown placeholder\(s\) \{\{nope\}\}"):
        handout.fill("a {{known}} and {{nope}}", {"known": "x"}, "t.md")


# ------------------------------------------------------------------------------- points, stated one way (item 3)
def test_the_starters_list_states_each_problems_points_as_its_handout_does(default_starter, default):
    """A starter has no hidden criteria, yet its ``grading list`` counts their points (from the course record)
    exactly as the kit's rubric has them, in the handout's words."""
    done = run_kit_command(["list"], cwd=default_starter, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[hidden]" not in done.stdout                      # the starter holds no hidden criterion
    stated = [line for line in done.stdout.splitlines() if line.startswith(("Problem ", "TOTAL "))]
    rubric = _rubric(DEFAULT_PROBLEMS)
    want = []
    for problem in DEFAULT_PROBLEMS:
        mine = [pts for sub, pts in rubric.items() if sub.split(".")[0] == problem]
        want.append((f"Problem {problem}", points.Tally(sum(p for p, _ in mine), sum(h for _, h in mine))))
    want.append(("TOTAL", points.Tally(sum(p for p, _ in rubric.values()), sum(h for _, h in rubric.values()))))
    assert stated == [f"Problem {p[8:]}: {t}" if p != "TOTAL" else f"TOTAL {t}" for p, t in want]
    sections = _sections(default)
    for problem, (_, tally) in zip(DEFAULT_PROBLEMS, want):
        assert f"**Points:** {tally}." in sections[problem]


def test_the_starters_grade_ends_with_the_total_the_handout_quotes(default_starter, default, fork_servers):
    """The starter's own ``grade``, and pytest's summary, state the hidden points it cannot run, from the course
    record."""
    quoted = re.search(r"`python -m grading grade --problem 1` ends with\n  `(TOTAL [^`]+)`", default)
    assert quoted, "the handout quotes the starter's TOTAL line"
    done = run_kit_command(["grade", "--quiet", "--problem", "1"], cwd=default_starter, timeout=900)
    assert done.returncode == 3, done.stdout + done.stderr              # nothing implemented yet
    assert done.stdout.strip().splitlines()[-1] == quoted.group(1)
    problem_1 = " or ".join(marker(sub) for sub in _rubric(("1",)))         # "p1_1 or p1_2 ...", from the rubric
    tested = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", problem_1,
                             "tests/test_problems.py"], cwd=default_starter, capture_output=True, text=True,
                            timeout=900, stdin=subprocess.DEVNULL)        # pytest's summary says it alike
    assert tested.returncode == 1, tested.stdout + tested.stderr
    assert quoted.group(1) in tested.stdout.splitlines(), tested.stdout[-2000:]
    assert f"Problem 1: {quoted.group(1)[len('TOTAL '):]}" in tested.stdout.splitlines(), tested.stdout[-2000:]
    public, hidden = (sum(v) for v in zip(*(pts for sub, pts in _rubric(("1",)).items())))
    assert quoted.group(1) == f"TOTAL {points.Tally(public, hidden, earned=0.0)}"


def test_optional_problems_are_stated_as_part_of_the_grade_when_handed_out(everything):
    """The overview names every optional problem handed out, agreeing in number with how many there are, and
    their points as ``grading.kit.points`` counts them."""
    rubric = _rubric(OPTIONAL)
    public, hidden = sum(p for p, _ in rubric.values()), sum(h for _, h in rubric.values())
    said = re.search(r"(Problems?) ([\d, and]+?) (goes|go) beyond the usual assignment \((.*?)\) and your course "
                     r"hands (it|them) out, so (it counts|they count) toward your grade like the others: (.*?) of the "
                     r"total above\.", " ".join(everything.split()))
    assert said, "the overview does not say the optional problems count"
    one = len(OPTIONAL) == 1
    assert re.findall(r"\d+", said[2]) == list(OPTIONAL), said[0]
    assert said.group(1, 3, 5, 6) == (("Problem", "goes", "it", "it counts") if one else
                                      ("Problems", "go", "them", "they count")), said[0]
    assert said[4] == usual_assignment() and re.findall(r"\d+", said[4]) == [DEFAULT_PROBLEMS[0], DEFAULT_PROBLEMS[-1]]
    assert said[7] == f"{points.count(public, 'public')} + {points.count(hidden, 'hidden')}", said[0]


# ------------------------------------------------------------------------------- the torch.distributed primer
def _primer(text: str) -> str:
    return text.split("## A torch.distributed primer\n")[1].split("\n## ")[0]


def test_the_primer_covers_groups_rendezvous_backends_two_ranks_and_hangs(default, default_starter):
    primer = _primer(default)
    for needed in ("process group", "rank", "world size", "file://", "env://", "gloo", "nccl", "torchrun",
                   "timeout=", "faulthandler.dump_traceback_later", "py-spy dump", "TORCH_DISTRIBUTED_DEBUG=DETAIL"):
        assert needed in primer, f"the primer does not explain {needed!r}"
    source = (default_starter / EXAMPLE).read_text()
    code = source.split('"""', 2)[2].strip()
    assert f"```python\n{code}\n```" in primer, "the primer shows the starter's example in full"
    assert f"python {EXAMPLE}" in primer and f"python {EXAMPLE} --hang" in primer


def test_the_primer_example_implements_no_student_function(default_starter):
    tree = ast.parse((default_starter / EXAMPLE).read_text())
    defined = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    student = {region.function for rel in student_files(ROOT)
               for region in parse_regions((ROOT / rel).read_text(), rel)}
    assert defined and not defined & student, defined & student
    assert "BEGIN_STUDENT" not in (default_starter / EXAMPLE).read_text()


TORCHRUN = ("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")     # what `torchrun` runs


def _run_example(starter: Path, *args: str, launcher: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *launcher, EXAMPLE, *args], cwd=starter, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("launcher", ["spawn", "torchrun"])
def test_the_primer_example_runs_two_gloo_ranks_and_prints_what_the_primer_says(launcher, default_starter, default):
    assert f"{'torchrun --standalone --nproc_per_node 2' if launcher == 'torchrun' else 'python'} {EXAMPLE}" \
        in _primer(default)
    done = _run_example(default_starter, launcher=TORCHRUN if launcher == "torchrun" else ())
    assert done.returncode == 0, done.stdout + done.stderr
    printed = sorted(line for line in done.stdout.splitlines() if line.strip())
    assert printed == ["rank 0 of 2: all_reduce gave 3", "rank 1 of 2: all_reduce gave 3"], done.stdout
    for line in printed:
        assert f"    {line}\n" in _primer(default)


def test_the_primer_example_shows_a_hang_as_the_primer_describes_it(default_starter, default):
    done = _run_example(default_starter, "--hang")
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "all_reduce gave" not in done.stdout
    dumps = out.split("Timeout (0:00:05)!")
    assert len(dumps) == 3, out                                 # one stack dump per rank
    assert "in all_reduce" in out and f'File "{default_starter / EXAMPLE}"' in out
    for quoted in ("Timeout (0:00:05)!", "Timed out waiting 10000ms for recv operation to complete"):
        assert quoted in _primer(default) and quoted in out, quoted


# ------------------------------------------------------------------------------- observe, order and time
@pytest.mark.parametrize("which", ["everything", "default"])
def test_every_section_says_what_to_observe_and_the_suggested_order_and_time(which, request):
    text = request.getfixturevalue(which)
    problems = ALL if which == "everything" else DEFAULT_PROBLEMS
    for problem, section in _sections(text).items():
        for part in ("**What you should observe.**", "**Speed and memory.**", plan.line(problem)):
            assert part in section, f"Problem {problem}: no {part!r}"
    order = text.split("## Suggested order and time\n")[1].split("\n## ")[0]
    assert plan.table(problems) in order
    assert re.findall(r"^\| Problem (\d+) \|", order, flags=re.MULTILINE) == list(problems)
    assert "The *efficiency* is speedup / N" in text and "read a CPU speedup against\n1" in text


def test_a_problems_plan_is_its_sub_problems_steps_in_id_order(monkeypatch):
    """A sub-problem added to Problem 1 joins its order and time by its step (``PLAN`` in its folder) alone; one
    without a step is refused, and a malformed step too, each naming the folder's file a TA writes it in."""
    subs = [sub for sub in plan.titles() if sub.split(".")[0] == "1"]
    extra = f"1.{max(int(s.split('.')[1]) for s in subs) + 1}"
    steps = plan.steps()
    monkeypatch.setattr(plan, "titles", lambda: {**{s: "" for s in subs}, extra: "toy"})
    with pytest.raises(ValueError, match=rf"no suggested order and time for {re.escape(extra)}: set PLAN = "
                                         rf"\(\"what to write, in order\", \(low, high\)\) in "
                                         rf"grading/problems/p1_{extra.split('.')[1]}_<name>/__init__.py$"):
        plan.line("1")
    monkeypatch.setattr(plan, "steps", lambda: {**steps, extra: plan.Step("`toy`", (1, 2))})
    added = plan.plan("1")
    assert added.order.endswith(f", then {extra} (`toy`)")
    assert added.order.startswith(" ".join(f"{s} ({steps[s].what})," for s in subs))
    assert added.hours == (sum(steps[s].hours[0] for s in subs) + 1, sum(steps[s].hours[1] for s in subs) + 2)
    monkeypatch.undo()
    monkeypatch.setattr(folders()[subs[0]], "PLAN", ("`toy`", (2, 1)))
    with pytest.raises(ValueError, match=rf"^{re.escape(plan.init_file(subs[0]))}: PLAN must be"):
        plan.line("1")


def test_hours_agree_with_their_number_and_a_range_of_equal_ends_is_one_number(monkeypatch):
    """A new problem whose one step takes (1, 1) hours reads "about 1 hour", in its section and in the table."""
    assert [plan.hours(*h) for h in ((1, 1), (2, 2), (1, 2), (0, 1))] == ["1 hour", "2 hours", "1-2 hours", "0-1 hours"]
    new = str(max(int(p) for p in ALL) + 1)
    monkeypatch.setattr(plan, "titles", lambda: {f"{new}.1": "toy"})
    monkeypatch.setattr(plan, "steps", lambda: {f"{new}.1": plan.Step("`toy`", (1, 1))})
    assert plan.line(new) == f"**Suggested order and time.** {new}.1 (`toy`); about 1 hour."
    low, high = plan.WRITE_UP.hours
    assert plan.table((new,)).splitlines()[2:] == [
        f"| Problem {new} | {new}.1 (`toy`) | 1 hour |", f"| figures and analysis | {plan.WRITE_UP.order} | "
        f"{plan.hours(low, high)} |", f"| **in all** | | **{plan.hours(low + 1, high + 1)}** |"]


def test_problem_1_gives_the_measured_losses_and_why_one_and_two_ranks_differ(default):
    section = _sections(default)["1"]
    for number in ("3.3305", "3.3885", "0.32 to 0.34", "0.345 to 0.365"):
        assert number in section
    assert "contiguous slice" in section and "not a bug" in section


# ------------------------------------------------------------------------------- the written analysis
@pytest.mark.parametrize("which", ["everything", "default"])
def test_the_written_analysis_in_the_readme_the_template_and_the_course_record(which, request):
    starter = request.getfixturevalue(f"{which}_starter")
    problems, worth = (ALL, ANALYSIS_POINTS) if which == "everything" else (DEFAULT_PROBLEMS, 0)
    asked = analysis.questions(problems)
    assert all(2 <= len(q) <= 4 for q in asked.values())
    readme = (starter / "README.md").read_text()
    section = readme.split("## Written analysis\n")[1].split("\n## ")[0]
    assert re.findall(r"^\*Problem (\d+)\*$", section, flags=re.MULTILINE) == list(problems)
    for problem, questions in asked.items():
        for k, question in enumerate(questions, 1):
            assert f"\n{k}. {question}\n" in section + "\n"
    says = f"worth **{worth} points**" if worth else "ungraded unless your staff say so"
    assert says in section and "staff" in section
    template = (starter / FIGURES_DIR / ANALYSIS_NAME).read_text()
    assert re.findall(r"^## Problem (\d+)$", template, flags=re.MULTILINE) == list(problems)
    assert template.count(ANSWER_PLACEHOLDER) == sum(len(q) for q in asked.values())
    assert says.replace("**", "") in " ".join(template.split())
    record = json.loads((starter / "grading/course.json").read_text())
    assert record["analysis_points"] == worth
    assert record["hidden_points"] == {sub: hidden for sub, (_, hidden) in _rubric(problems).items()}


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_bad_analysis_points_are_refused_in_one_line_and_nothing_written(value, tmp_path, capsys):
    out = tmp_path / "starter"
    assert main(["release", str(out), "--analysis_points", value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: --analysis_points {value}"), err
    assert not out.exists()


def test_the_starters_submission_zip_carries_the_analysis_and_says_it_is_unanswered(default_starter, tmp_path):
    archive = tmp_path / "submission.zip"
    done = subprocess.run(["bash", "scripts/create_submission_zip.sh", "--output", str(archive)],
                          cwd=default_starter, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{FIGURES_DIR}/{ANALYSIS_NAME}" in zipfile.ZipFile(archive).namelist()
    questions = sum(len(q) for q in analysis.questions(DEFAULT_PROBLEMS).values())
    assert f"{ANALYSIS_NAME} has {questions} question(s) still unanswered" in done.stderr, done.stderr
