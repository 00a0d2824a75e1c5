"""``python -m grading release OUT [--problems 1,2,3]``: the student starter, made from the kit.

The starter gives nothing away: every region body becomes a stub, and the staff answers and hidden checks, the
kit's own tests and the files of optional problems the course did not choose stay out (``released``).
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from grading.kit.course import COURSE_RECORD, parse_problems, record_text
from common.handin import ANALYSIS_NAME, FIGURES_DIR
from grading.staff import expected, handout
from grading.staff.handout import analysis
from grading.staff.handout.rubric import sub_points
from common.regions import PRISTINE_DIR, STUDENT_PACKAGES, parse_regions, student_files
from grading.kit.splice import PROTECTED_RECORD, replace_bodies, stub_body
from grading.kit.course import DEFAULT_PROBLEMS
from grading.problems import titles

# Never copied into a release (solution-only, staff-only or local state).
RELEASE_EXCLUDE = (".git", ".ci", "workdir", "tests/kit", "grading/staff", "grading/problems/*/staff.py",
                   "grading/pristine", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".venv", "venv",
                   ".ipynb_checkpoints", ".DS_Store",
                   "submit_figures/*.png", "submit_figures/*.json", "results.json", "submission.zip",
                   COURSE_RECORD, "grading/commands/release.py", "grading/commands/gradescope.py",
                   "docs", "scripts/bench_grading.py", "scripts/measure_footprint.py",   # staff guides and tools
                   "requirements-staff.txt", "grading/commands/mutants.py",
                   "grading/commands/templates/mutants.html", "grading/kit/mutations.py",
                   "grading/kit/variants.py", "grading/commands/variants.py",   # buggy variants
                   "grading/problems/*/variants.py",
                   "grading/commands/settings_page.py",
                   "grading/problems/*/equivalent_mutants.json")     # mutation analysis
# The tests a starter keeps: the thin wrappers over the checks (the kit's other tests test the kit itself).
STUDENT_TESTS = ("tests/__init__.py", "tests/conftest.py", "tests/test_problems.py")
# Files that belong to an optional problem: left out unless the course chooses it.
OPTIONAL_FILES = {
    "4": ("data_parallel/ddp.py", "data_parallel/zero1.py", "data_parallel/checkpoint.py", "project/run_capstone.py",
          "project/bench/ddp_peers.py", "grading/problems/p4_*/*"),
    "5": ("tensor_parallel/*", "tensor_parallel/**/*", "project/run_tensor_parallel.py",
          "project/bench/tensor_parallel.py", "grading/problems/p5_*/*"),
}


def _matches(rel: str, pattern: str) -> bool:
    return Path(rel).match(pattern) or rel == pattern


def released(rel: str, problems: tuple[str, ...]) -> bool:
    """True when kit file ``rel`` belongs in a starter for ``problems``."""
    parts = rel.split("/")
    for pattern in RELEASE_EXCLUDE:
        if "*" in pattern:
            if Path(rel).match(pattern):
                return False
        elif rel == pattern or rel.startswith(pattern + "/") or pattern in parts:
            return False
    if rel.startswith("tests/") and not any(Path(rel).match(p) for p in STUDENT_TESTS):
        return False
    for problem, patterns in OPTIONAL_FILES.items():
        if problem not in problems and any(_matches(rel, p) for p in patterns):
            return False
    return True


def staff_files(kit_root: Path, problems: tuple[str, ...]) -> list[str]:
    """Kit-relative paths of the staff-only files a Gradescope bundle for ``problems`` adds to the starter.

    ``grading/staff`` (without a kit's own course secret) and the ``staff.py`` of every chosen folder.
    """
    kit_root = Path(kit_root)
    found = []
    for path in sorted((kit_root / "grading").rglob("*")):
        rel = path.relative_to(kit_root).as_posix()
        if not path.is_file() or "__pycache__" in rel or rel.endswith(".pyc") or rel.endswith("course_secret.txt"):
            continue
        if rel.startswith("grading/staff/") or Path(rel).match("grading/problems/*/staff.py"):
            if not any(problem not in problems and _matches(rel, pattern)
                       for problem, patterns in OPTIONAL_FILES.items() for pattern in patterns):
                found.append(rel)
    return found


def student_readme(kit_root: Path, problems: tuple[str, ...], preface: str = "", analysis_points: float = 0.0) -> str:
    """The starter's README: ``preface`` (the course's own text, first, as given), then the handout for
    ``problems`` (``grading.staff.handout.render``: a section per problem with its points from the rubric),
    saying ``analysis_points`` for the written analysis.

    The table of what to fill in is made from the regions themselves (problem, title, files, functions), so
    it cannot drift. Raises ValueError when a handout template is broken.
    """
    where: dict[str, dict[str, list[str]]] = {}
    for rel in student_files(kit_root, problems):
        for region in parse_regions((kit_root / rel).read_text(), rel):
            functions = where.setdefault(region.id, {}).setdefault(rel, [])
            if region.function not in functions:
                functions.append(region.function)
    rows = ["| problem | what | file: functions |", "|---|---|---|"]
    for problem in sorted(where, key=lambda p: [int(x) for x in p.split(".")]):
        files = "; ".join(f"`{rel}`: " + ", ".join(f"`{f}`" for f in fns) for rel, fns in where[problem].items())
        rows.append(f"| {problem} | {titles()[problem]} | {files} |")
    text = handout.render(kit_root, problems, "\n".join(rows), analysis_points)
    return f"{preface.rstrip()}\n\n{text}" if preface.strip() else text


def read_preface(path: Path | str) -> str:
    """The text of the preface file ``path`` (UTF-8, not empty); ValueError in one line when it is not usable."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"--preface {path}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"--preface {path}: a folder, not a file") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"--preface {path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ValueError(f"--preface {path}: cannot be read ({exc.strerror or exc})") from None
    if not text.strip():
        raise ValueError(f"--preface {path}: the file is empty")
    return text


def check_analysis_points(points: float) -> float:
    """``points`` for the written analysis as a float; ValueError in one line when it is negative or not finite."""
    value = float(points)
    if not 0 <= value < float("inf"):
        raise ValueError(f"--analysis_points {points}: give 0 (ungraded) or a positive number of points")
    return value


def release(kit_root: Path, out_dir: Path, problems: tuple[str, ...] = DEFAULT_PROBLEMS,
            preface: Path | str | None = None, analysis_points: float = 0.0) -> dict:
    """Write the student starter of ``kit_root`` for ``problems`` into ``out_dir`` (absent or empty).

    ``preface``: a UTF-8 file whose text goes first in the starter's README
    (course name, deadline, policies). ``analysis_points``: what the course
    gives the written analysis (0: ungraded unless the staff say so),
    stated in the README and the template. Besides the kit files ``released``
    keeps (each student file with every region body a stub, and a pristine
    copy of the student packages in ``grading/pristine/``, what a local grade
    splices into), the starter gets the handout as its README
    (``student_readme``), each chosen folder's ``expected.json`` written fresh
    from the staff answers, ``submit_figures/analysis.md`` (the written
    analysis's questions) and ``grading/course.json`` (the problems, the hidden
    points of each sub-problem, the analysis points). Validates everything first (markers,
    problems, preface, target) and writes nothing when it raises: RegionError
    for malformed markers, FileExistsError for a non-empty ``out_dir``,
    ValueError for a target inside the kit, an unknown problem or an
    unreadable or empty preface or negative analysis points. Returns the release record (also written to
    ``grading/protected.json``): the problems, the regions of every student
    file and a SHA-256 of every other released file (a starter's ``grade``
    warns when its grader files differ from them).
    """
    problems = parse_problems(",".join(problems))
    kit_root, out_dir = Path(kit_root).resolve(), Path(out_dir).resolve()
    _check_target(kit_root, out_dir)
    preface_text = read_preface(preface) if preface is not None else ""
    analysis_points = check_analysis_points(analysis_points)
    student_files(kit_root)                   # validates every marker first
    record: dict = {"problems": list(problems), "student_files": {}, "provided_files": {}}
    staged = _stage_kit_files(kit_root, problems, record["student_files"])
    staged |= _generated_files(kit_root, problems, preface_text, analysis_points)
    _write_staged(kit_root, out_dir, staged, record)
    return record


def _check_target(kit_root: Path, out_dir: Path) -> None:
    """ValueError for a release target inside the kit, FileExistsError for one that is not empty."""
    if out_dir == kit_root or kit_root in out_dir.parents:
        raise ValueError(f"release target {out_dir} must be outside the kit {kit_root}")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"release target {out_dir} is not empty")


def _stage_kit_files(kit_root: Path, problems: tuple[str, ...], student_record: dict) -> dict[str, bytes]:
    """``{rel: bytes}`` of every kit file ``released`` keeps: each student file with its region bodies stubbed
    (its regions go into ``student_record``), the others as they are; the student packages also under
    ``PRISTINE_DIR``."""
    students = set(student_files(kit_root, problems))
    files = [p for p in sorted(kit_root.rglob("*")) if p.is_file()
             and released(p.relative_to(kit_root).as_posix(), problems)]
    staged: dict[str, bytes] = {}
    for file in files:
        rel = file.relative_to(kit_root).as_posix()
        if rel == PROTECTED_RECORD:
            continue
        if rel in students:
            text = file.read_text()
            regions = parse_regions(text, rel)
            starter = replace_bodies(text, rel, {k: stub_body(r) for k, r in enumerate(regions)})
            staged[rel] = staged[f"{PRISTINE_DIR}/{rel}"] = starter.encode()
            student_record[rel] = {"regions": [r.id for r in regions]}
        else:
            staged[rel] = file.read_bytes()
            if rel.split("/")[0] in STUDENT_PACKAGES:
                staged[f"{PRISTINE_DIR}/{rel}"] = staged[rel]
    return staged


def _generated_files(kit_root: Path, problems: tuple[str, ...], preface_text: str,
                     analysis_points: float) -> dict[str, bytes]:
    """``{rel: bytes}`` of what the release writes fresh: the handout README, the analysis template, each chosen
    folder's ``expected.json`` and the course record."""
    generated = {"README.md": student_readme(kit_root, problems, preface_text, analysis_points).encode(),
                 f"{FIGURES_DIR}/{ANALYSIS_NAME}": analysis.template(problems, analysis_points).encode()}
    for rel, text in expected.rendered(problems).items():
        generated[rel] = text.encode()
    hidden = {sub: row.tally.hidden for sub, row in sub_points(problems).items()}
    generated[COURSE_RECORD] = record_text(problems, hidden, analysis_points).encode()
    return generated


def _write_staged(kit_root: Path, out_dir: Path, staged: dict[str, bytes], record: dict) -> None:
    """Write ``staged`` into ``out_dir`` (with the kit file's mode where there is one), the SHA-256 of every
    provided file into ``record`` and ``record`` into ``PROTECTED_RECORD``."""
    for rel, data in staged.items():
        if rel not in record["student_files"] and not rel.startswith(PRISTINE_DIR + "/"):
            record["provided_files"][rel] = hashlib.sha256(data).hexdigest()
        target = out_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        if (kit_root / rel).is_file():
            shutil.copymode(kit_root / rel, target)
    (out_dir / PROTECTED_RECORD).parent.mkdir(parents=True, exist_ok=True)
    (out_dir / PROTECTED_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record
