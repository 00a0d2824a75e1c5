"""Submission intake and the disposable grading copy.

The grader never runs a submission's files as they are: it copies the kit,
then splices the submission's *region bodies* into the kit's own student
files. Text outside the regions always comes from the kit; any difference
there is reported as tampering and ignored.
"""
from __future__ import annotations

import shutil
import stat
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from grading.regions import (RegionError, parse_regions, protected_text, replace_bodies, stub_body,
                             student_files)

MAX_ZIP_BYTES = 50 * 1024 * 1024          # uncompressed total
MAX_ZIP_MEMBERS = 5000
COPY_IGNORE = shutil.ignore_patterns(".git", "workdir", "__pycache__", ".pytest_cache", "*.pyc", "*.png")


class SubmissionError(ValueError):
    """The submission cannot be graded at all (bad zip, no student files, ambiguous layout)."""


@dataclass
class SpliceReport:
    """What was taken from the submission and what was ignored."""

    files: list[str] = field(default_factory=list)            # student files found in the submission
    missing_files: list[str] = field(default_factory=list)
    missing_regions: list[str] = field(default_factory=list)  # "path: region 1.2 (average_gradients)"
    tampered: list[str] = field(default_factory=list)         # files whose protected text differs
    malformed: list[str] = field(default_factory=list)        # RegionError messages

    def notes(self) -> list[str]:
        """Human-readable lines for the report (empty when the submission is clean)."""
        lines = [f"missing file (graded as not implemented): {f}" for f in self.missing_files]
        lines += [f"missing region (graded as not implemented): {r}" for r in self.missing_regions]
        lines += [f"malformed markers (file graded as not implemented): {m}" for m in self.malformed]
        lines += [f"changed outside the student regions (ignored; the kit's text was used): {f}"
                  for f in self.tampered]
        return lines


def extract_zip(zip_path: Path, dest: Path) -> Path:
    """Extract ``zip_path`` into ``dest`` safely and return ``dest``.

    Raises SubmissionError for a corrupt zip, absolute or ``..`` paths,
    symlinks, more than MAX_ZIP_MEMBERS members, or more than MAX_ZIP_BYTES
    uncompressed; nothing is extracted in those cases.
    """
    try:
        archive = zipfile.ZipFile(zip_path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise SubmissionError(f"{zip_path}: not a readable zip file ({exc})") from None
    with archive:
        members = archive.infolist()
        if len(members) > MAX_ZIP_MEMBERS:
            raise SubmissionError(f"{zip_path}: {len(members)} members (limit {MAX_ZIP_MEMBERS})")
        total = sum(m.file_size for m in members)
        if total > MAX_ZIP_BYTES:
            raise SubmissionError(f"{zip_path}: {total} bytes uncompressed (limit {MAX_ZIP_BYTES})")
        for member in members:
            name = member.filename
            parts = Path(name).parts
            if name.startswith(("/", "\\")) or ".." in parts or (parts and ":" in parts[0]):
                raise SubmissionError(f"{zip_path}: unsafe path {name!r} in the zip")
            if stat.S_ISLNK(member.external_attr >> 16):
                raise SubmissionError(f"{zip_path}: symlink {name!r} in the zip")
        archive.extractall(dest)
    return dest


def find_root(folder: Path, kit_student_files: list[str]) -> Path:
    """The folder inside ``folder`` that holds the student files (it may be wrapped in one directory).

    Raises SubmissionError when no student file is found, or when several
    folders each hold student files (ambiguous).
    """
    candidates = set()
    for rel in kit_student_files:
        for hit in folder.rglob(Path(rel).name):
            if hit.is_symlink():
                raise SubmissionError(f"symlink {hit.relative_to(folder)} in the submission")
            if hit.as_posix().endswith("/" + rel):
                candidates.add(Path(hit.as_posix()[: -len(rel) - 1]))
    if not candidates:
        raise SubmissionError(f"{folder}: no student file found (expected e.g. {kit_student_files[0]})")
    if len(candidates) > 1:
        listed = ", ".join(sorted(str(c.relative_to(folder)) or "." for c in candidates))
        raise SubmissionError(f"{folder}: ambiguous layout, student files found under several folders: {listed}")
    return candidates.pop()


def open_submission(path: Path, kit_root: Path, scratch: Path) -> Path:
    """Return the folder holding a submission's student files (extracting a zip into ``scratch``)."""
    path = Path(path)
    if not path.exists():
        raise SubmissionError(f"{path}: no such file or folder")
    if path.is_file():
        path = extract_zip(path, scratch / "extracted")
    return find_root(path, student_files(kit_root))


def build_grading_copy(kit_root: Path, submission_root: Path, dest: Path) -> SpliceReport:
    """Copy the kit to ``dest`` and splice in the submission's region bodies; return what happened.

    A region is matched by (problem id, enclosing function, occurrence). Files
    or regions the submission lacks keep the starter's NotImplementedError
    body, so they score zero like unfinished work.
    """
    kit_root, submission_root = Path(kit_root), Path(submission_root)
    shutil.copytree(kit_root, dest, ignore=COPY_IGNORE, symlinks=False)
    report = SpliceReport()
    for rel in student_files(kit_root):
        kit_text = (kit_root / rel).read_text()
        kit_regions = parse_regions(kit_text, rel)
        starter = {k: stub_body(r) for k, r in enumerate(kit_regions)}
        submitted = submission_root / rel
        if not submitted.is_file() or submitted.is_symlink():
            report.missing_files.append(rel)
            (dest / rel).write_text(replace_bodies(kit_text, rel, starter))
            continue
        report.files.append(rel)
        try:
            sub_text = submitted.read_text(errors="replace")
            sub_regions = parse_regions(sub_text, rel)
        except RegionError as exc:
            report.malformed.append(str(exc))
            (dest / rel).write_text(replace_bodies(kit_text, rel, starter))
            continue
        if protected_text(sub_text, rel) != protected_text(kit_text, rel):
            report.tampered.append(rel)
        by_key: dict[tuple, str] = {}
        counts: dict[tuple, int] = {}
        for region in sub_regions:
            key = (region.id, region.function)
            by_key[key + (counts.get(key, 0),)] = region.body
            counts[key] = counts.get(key, 0) + 1
        bodies, counts = {}, {}
        for k, region in enumerate(kit_regions):
            key = (region.id, region.function)
            occurrence = counts.get(key, 0)
            counts[key] = occurrence + 1
            body = by_key.get(key + (occurrence,))
            if body is None:
                report.missing_regions.append(f"{rel}: region {region.id} ({region.function})")
                body = starter[k]
            bodies[k] = body
        (dest / rel).write_text(replace_bodies(kit_text, rel, bodies))
    return report


def scratch_dir() -> Path:
    """A fresh temporary folder for one grading run."""
    return Path(tempfile.mkdtemp(prefix="grading-run-"))
