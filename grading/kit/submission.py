"""The disposable grading copy: the kit, with a submission's region bodies spliced into its student files.

The grader never runs a submission's files as they are (``build_grading_copy``): text outside the regions always
comes from the kit, and a difference there is noted and ignored (``SpliceReport``). ``grading.kit.intake`` finds
the submission's files on disk.
"""
from __future__ import annotations

import io
import re
import shutil
import tempfile
import textwrap
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from grading.kit.bytecode import write_bytecode
from grading.kit.course import chosen_problems
from grading.kit.problem import STAFF_MODULE
from grading.kit.region_hints import static_hints
from grading.kit.secret import SECRET_FILE, STAFF_PACKAGE
from common.regions import PRISTINE_DIR, STUDENT_PACKAGES, RegionError, parse_regions, student_files
from grading.kit.splice import kit_text, protected_text, replace_bodies, stub_body
from grading.kit.student_lines import line_map, location_pattern, outside_note

MAX_STUDENT_FILE_BYTES = 1024 * 1024      # one student .py file
# Region code that reaches into the grader (imports it, loads modules by name, or names its files): the
# region's problem scores zero. Matched on the code without its comments.
GRADER_ACCESS = re.compile(r"\bgrading|\b__import__\b|\bimportlib\b|\bsys\.modules\b|RankContext|parts\.log|"
                           r"\bfixtures\b", re.IGNORECASE)
# Region code that reaches for the process itself: flagged for staff review, never penalised.
SUSPICIOUS = re.compile(
    r"\bgc\.get_objects|"
    r"\bctypes\b|\bos\.(?:fork|setsid|kill|_exit)\b|\bsubprocess\b|/proc/|\b__builtins__\b|\bbuiltins\b|"
    r"\bsys\._getframe\b|\binspect\.(?:stack|currentframe)\b|\bsys\.argv\b|\b(?:site|user)customize\b|"
    r"\btorch\.(?:allclose|equal|isclose|testing\.assert_close)\s*=(?!=)")
RANK_PACKAGES = ("grading", "common", *STUDENT_PACKAGES)   # what a grading copy's ranks import from it
COPY_IGNORE = shutil.ignore_patterns(".git", "workdir", "__pycache__", ".pytest_cache", "*.pyc", "*.png")
# What a grading copy never holds: ranks read it, and only the grader may know the staff parts and the kit's
# own tests (their variants quote the reference's regions).
STAFF_IGNORE = shutil.ignore_patterns(STAFF_PACKAGE.rpartition(".")[2], f"{STAFF_MODULE}.py", SECRET_FILE.name)
COPY_LEAVES_OUT = {"tests", "docs", ".ci"}


@dataclass
class SpliceReport:
    """What was taken from the submission and what was ignored.

    A ``path:line`` in ``syntax_errors``, ``refused`` and ``hints`` is a line of the grading copy (the spliced
    file the ranks run), like every location a rank reports; ``student_lines`` rewrites such a text to the
    lines of the files the student submitted, and ``notes`` does so itself. ``malformed`` and
    ``outside_regions`` name the submitted file's lines already.
    """

    files: list[str] = field(default_factory=list)            # student files found in the submission
    missing_files: list[str] = field(default_factory=list)
    missing_regions: list[str] = field(default_factory=list)  # "path: region 1.2 (average_gradients)"
    tampered: list[str] = field(default_factory=list)         # files whose protected text differs
    malformed: list[str] = field(default_factory=list)        # RegionError messages
    provided_changed: list[str] = field(default_factory=list) # provided files that differ from the kit's
    extra_files: list[str] = field(default_factory=list)      # .py files in student packages the kit lacks
    syntax_errors: list[str] = field(default_factory=list)    # "path:line: message" of the spliced files
    suspicious: list[str] = field(default_factory=list)       # "path: region 1.2 (fn) mentions 'ctypes'"
    refused: dict[str, str] = field(default_factory=dict)      # problem -> why it scores zero (grader access)
    hints: dict[str, list[str]] = field(default_factory=dict) # problem -> likely causes read from its regions
    outside_regions: dict[str, str] = field(default_factory=dict)  # tampered path -> "path: what was dropped"
    line_maps: dict[str, tuple[int, ...]] = field(default_factory=dict)  # where they differ: path -> line_map

    def notes(self) -> list[str]:
        """Human-readable lines for the report (empty when the submission is clean), on the submitted lines."""
        lines = [f"missing file (graded as not implemented): {f}" for f in self.missing_files]
        lines += [f"missing region (graded as not implemented): {r}" for r in self.missing_regions]
        lines += [f"malformed markers (file graded as not implemented): {m}" for m in self.malformed]
        lines += [self.student_lines(f"does not compile (the checks that import it fail): {e}")
                  for e in self.syntax_errors]
        lines += [f"changed outside the student regions (ignored; the kit's text was used): "
                  f"{self.outside_regions.get(f, f)}" for f in self.tampered]
        lines += [f"changed provided file (ignored; the kit's copy was used): {f}" for f in self.provided_changed]
        lines += [f"file not in the kit (ignored; only region bodies are graded): {f}" for f in self.extra_files]
        lines += [f"flagged for staff review (no points deducted): {f}" for f in self.suspicious]
        lines += [self.student_lines(f"Problem {problem} scores 0: {why}")
                  for problem, why in sorted(self.refused.items())]
        return lines

    def student_lines(self, message: str) -> str:
        """``message`` with every location in a student file of the grading copy (``data_parallel/comm.py:66``,
        also behind a folder, and a traceback's ``File ".../data_parallel/comm.py", line 66``) naming the line
        of the file the student submitted instead (``line_maps``); other text, and the files the submission
        did not hold, stay as they are. Apply it once: its output is in the submitted file's lines.
        """
        if not self.line_maps or not message:
            return message

        def submitted(match: re.Match) -> str:
            lines, number = self.line_maps[match["path"]], int(match["line"])
            line = lines[number - 1] if 1 <= number <= len(lines) else number
            return f"{match['path']}{match['sep']}{line}"
        return location_pattern(tuple(sorted(self.line_maps))).sub(submitted, message)


def build_grading_copy(kit_root: Path, submission_root: Path, dest: Path) -> SpliceReport:
    """Copy the kit to ``dest`` without its staff parts (the ``staff`` package, every ``staff.py``, the course
    secret) and its own tests and docs (``COPY_LEAVES_OUT``), and splice in the submission's region bodies; return
    what happened.

    A region is matched by (problem id, enclosing function, occurrence). Files
    or regions the submission lacks keep the starter's NotImplementedError
    body, so they score zero like unfinished work. The packages ranks import (``RANK_PACKAGES``) come with
    their bytecode (``grading.kit.bytecode``).
    """
    kit_root, submission_root = Path(kit_root), Path(submission_root)
    _copy_kit(kit_root, dest)
    pristine_root = kit_root / PRISTINE_DIR
    report = SpliceReport()
    students = student_files(kit_root, chosen_problems())
    if pristine_root.is_dir() or submission_root.resolve() != kit_root.resolve():
        _compare_provided(pristine_root if pristine_root.is_dir() else kit_root, submission_root, students, report)
    for rel in students:
        _splice_file(kit_root, submission_root, dest, rel, report)
    write_bytecode(dest, RANK_PACKAGES)
    return report


def _copy_kit(kit_root: Path, dest: Path) -> None:
    """The kit at ``dest`` without what a grading copy leaves out; in a starter, the student packages as
    released (its ``PRISTINE_DIR``)."""
    def ignore(folder: str, names: list[str]) -> set[str]:
        top = {n for n in names if n in COPY_LEAVES_OUT} if Path(folder) == kit_root else set()
        return set(COPY_IGNORE(folder, names)) | set(STAFF_IGNORE(folder, names)) | top
    shutil.copytree(kit_root, dest, ignore=ignore, symlinks=False)
    pristine_root = kit_root / PRISTINE_DIR
    if pristine_root.is_dir():
        for package in STUDENT_PACKAGES:
            shutil.rmtree(dest / package, ignore_errors=True)
            if (pristine_root / package).is_dir():
                shutil.copytree(pristine_root / package, dest / package, ignore=COPY_IGNORE)


def _splice_file(kit_root: Path, submission_root: Path, dest: Path, rel: str, report: SpliceReport) -> None:
    """Write ``dest/rel``: the kit's text of the student file ``rel`` with the submission's region bodies (the
    starter's where the file or a region is missing or malformed), noting in ``report`` what happened."""
    pristine = kit_text(kit_root, rel)
    kit_regions = parse_regions(pristine, rel)
    starter = {k: stub_body(r) for k, r in enumerate(kit_regions)}
    submitted = submission_root / rel
    if not submitted.is_file() or _through_symlink(submission_root, rel):
        report.missing_files.append(rel + (" (a symlink: ignored)" if submitted.exists() else ""))
        (dest / rel).write_text(replace_bodies(pristine, rel, starter))
        return
    report.files.append(rel)
    try:
        if submitted.stat().st_size > MAX_STUDENT_FILE_BYTES:
            raise RegionError(f"{rel}: larger than {MAX_STUDENT_FILE_BYTES} bytes")
        sub_text = submitted.read_text(errors="replace")
        sub_regions = parse_regions(sub_text, rel)
    except RegionError as exc:
        report.malformed.append(str(exc))
        (dest / rel).write_text(replace_bodies(pristine, rel, starter))
        return
    if protected_text(sub_text, rel) != protected_text(pristine, rel):
        report.tampered.append(rel)
    bodies = _matched_bodies(rel, kit_regions, sub_regions, starter, report)
    spliced = replace_bodies(pristine, rel, bodies)
    (dest / rel).write_text(spliced)
    if rel in report.tampered:
        report.outside_regions[rel] = outside_note(rel, pristine, spliced, sub_text)
    if spliced != sub_text:
        report.line_maps[rel] = line_map(spliced, sub_text)
    try:
        compile(spliced, rel, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as exc:
        report.syntax_errors.append(f"{rel}:{getattr(exc, 'lineno', '?')}: {getattr(exc, 'msg', exc)}")


def _matched_bodies(rel: str, kit_regions: list, sub_regions: list, starter: dict[int, str],
                    report: SpliceReport) -> dict[int, str]:
    """Region index -> the body the grading copy gets: the submission's region of the same (problem, function,
    occurrence), else the starter's; each submitted body is inspected (``_inspect_body``) at its line in the
    grading copy."""
    by_key: dict[tuple, str] = {}
    counts: dict[tuple, int] = {}
    for region in sub_regions:
        key = (region.id, region.function)
        by_key[key + (counts.get(key, 0),)] = region.body
        counts[key] = counts.get(key, 0) + 1
    bodies, counts = {}, {}
    shift = 0               # how far the grading copy's lines have moved from the kit's, before region k
    for k, region in enumerate(kit_regions):
        key = (region.id, region.function)
        occurrence = counts.get(key, 0)
        counts[key] = occurrence + 1
        body = by_key.get(key + (occurrence,))
        if body is None:
            report.missing_regions.append(f"{rel}: region {region.id} ({region.function})")
            body = starter[k]
        bodies[k] = body
        begin = region.begin_line + shift      # its BEGIN marker's line in the grading copy
        shift += len(body.splitlines()) - len(region.body.splitlines())
        if body is not starter[k]:
            _inspect_body(rel, region, body, begin, report)
    return bodies


def _inspect_body(rel: str, region, body: str, begin: int, report: SpliceReport) -> None:
    """Note in ``report`` what a submitted region ``body`` (BEGIN marker at line ``begin`` of the grading copy)
    reaches for: the grader (its problem then scores zero), static hints, suspicious names."""
    access = grader_access(body)
    if access and region.id not in report.refused:
        offset, text = access
        report.refused[region.id] = (f"{rel}:{begin + offset}: region {region.id} "
                                    f"({region.function}) reaches into the grader ('{text}'); "
                                    "region code may use only the student packages, torch and the "
                                    "libraries the kit installs")
    found_hints = static_hints(body, begin + 1, rel)
    if found_hints:
        report.hints.setdefault(region.id, []).extend(found_hints)
    found = sorted({m.group(0) for m in SUSPICIOUS.finditer(body)})
    if found:
        report.suspicious.append(f"{rel}: region {region.id} ({region.function}) mentions "
                                 + ", ".join(f"'{text}'" for text in found[:5]))


def grader_access(body: str) -> tuple[int, str] | None:
    """``(line offset in body, matched text)`` of the first place ``body`` reaches into the grader, or None.

    Comments do not count; names, attributes and string literals do (``import
    grading``, ``importlib.import_module("grad" + "ing")``, ``open("grading/...")``).
    """
    code = _without_comments(body)
    match = GRADER_ACCESS.search(code)
    if match is None:
        return None
    return code.count("\n", 0, match.start()) + 1, match.group(0)


def _without_comments(body: str) -> str:
    """``body`` with every comment blanked out (line numbers kept); the body itself when it does not tokenize."""
    text = textwrap.dedent(body)
    lines = text.splitlines(keepends=True)
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                row, col = token.start
                lines[row - 1] = lines[row - 1][:col] + " " * (token.end[1] - col) + lines[row - 1][token.end[1]:]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return body
    return "".join(lines)


def _through_symlink(root: Path, rel: str) -> bool:
    """True when ``root/rel`` or any folder between ``root`` and it is a symlink."""
    path = Path(root)
    for part in Path(rel).parts:
        path = path / part
        if path.is_symlink():
            return True
    return False


def _compare_provided(kit_root: Path, submission_root: Path, students: list[str], report: SpliceReport) -> None:
    """Note provided .py files of the student packages that the submission changed, and files the kit lacks.

    ``kit_root`` holds the kit's own copies (the pristine folder in a starter).
    """
    for package in STUDENT_PACKAGES:
        folder = submission_root / package
        if not folder.is_dir() or _through_symlink(submission_root, package):
            continue
        for file in sorted(folder.rglob("*.py")):
            rel = file.relative_to(submission_root).as_posix()
            if "__pycache__" in rel or rel in students or file.is_symlink():
                continue
            kit_file = kit_root / rel
            if not kit_file.is_file():
                report.extra_files.append(rel)
            elif file.stat().st_size > MAX_STUDENT_FILE_BYTES or file.read_bytes() != kit_file.read_bytes():
                report.provided_changed.append(rel)


def scratch_dir() -> Path:
    """A fresh temporary folder for one grading run."""
    return Path(tempfile.mkdtemp(prefix="grading-run-"))
