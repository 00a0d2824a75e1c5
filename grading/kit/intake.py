"""Submission intake: from a zip file or folder on disk to the folder that holds the student files.

A zip is extracted safely (no absolute or ``..`` paths, no symlinks, bounded size and member count), and the
tree is walked without following symlinks, skipping version-control, cache and virtual-environment folders.
"""
from __future__ import annotations

import os
import stat
import zipfile
import zlib
from pathlib import Path

from grading.kit.course import chosen_problems
from common.regions import student_files

MAX_ZIP_BYTES = 50 * 1024 * 1024          # uncompressed total
MAX_ZIP_MEMBERS = 5000
MAX_TREE_ENTRIES = 20000                  # files and folders looked at in a folder submission
SKIPPED_DIRS = {"grading", ".git", "__MACOSX", "__pycache__", ".venv", "venv", "node_modules", ".ipynb_checkpoints",
                "site-packages", ".pytest_cache"}


class SubmissionError(ValueError):
    """The submission cannot be graded at all (bad zip, no student files, ambiguous layout)."""


def extract_zip(zip_path: Path, dest: Path) -> Path:
    """Extract ``zip_path`` into ``dest`` safely and return ``dest``.

    Raises SubmissionError for a corrupt, encrypted or oversized zip file,
    absolute or ``..`` paths, symlinks, more than MAX_ZIP_MEMBERS members, or
    more than MAX_ZIP_BYTES uncompressed; nothing is extracted in the
    up-front cases (a member that turns out corrupt while extracting may
    leave earlier members in ``dest``).
    """
    if Path(zip_path).stat().st_size > MAX_ZIP_BYTES:
        raise SubmissionError(f"{zip_path}: the zip file is larger than {MAX_ZIP_BYTES} bytes")
    try:
        archive = zipfile.ZipFile(zip_path)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
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
            if member.flag_bits & 0x1:
                raise SubmissionError(f"{zip_path}: {name!r} is encrypted; submit a zip without a password")
        try:
            archive.extractall(dest)
        except (zipfile.BadZipFile, OSError, RuntimeError, NotImplementedError, EOFError, zlib.error) as exc:
            raise SubmissionError(f"{zip_path}: the zip cannot be extracted ({exc})") from None
    return dest


def _walk(folder: Path, guarded_names: set[str]):
    """Yield every file under ``folder`` without following symlinks or entering SKIPPED_DIRS.

    Raises SubmissionError for more than MAX_TREE_ENTRIES entries, or for a
    symlink named like a student package or file (``guarded_names``).
    """
    seen = 0
    for top, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        seen += len(dirs) + len(files)
        if seen > MAX_TREE_ENTRIES:
            raise SubmissionError(f"{folder}: more than {MAX_TREE_ENTRIES} files and folders; submit only "
                                  "your code")
        for name in dirs + files:
            path = Path(top) / name
            if name in guarded_names and path.is_symlink():
                target = os.readlink(path)
                where = "outside the submission" if not _inside(folder, path) else "inside the submission"
                raise SubmissionError(f"{path.relative_to(folder)} is a symlink (to {target}, {where}); "
                                      "submit the files themselves")
        for name in files:
            yield Path(top) / name


def _inside(root: Path, path: Path) -> bool:
    """True when ``path`` resolves to a location under ``root`` (symlinks followed)."""
    try:
        return Path(path).resolve().is_relative_to(Path(root).resolve())
    except (OSError, RuntimeError):
        return False


def find_root(folder: Path, kit_student_files: list[str]) -> Path:
    """The folder inside ``folder`` that holds the student files (it may be wrapped in one directory).

    Raises SubmissionError when no student file is found, when several
    folders each hold student files (ambiguous), when a student file or
    package is a symlink, or when the tree is absurdly large. Symlinks are
    never followed; ``__MACOSX``, ``.git`` and virtual environments are skipped.
    """
    folder = Path(folder).resolve()
    guarded = {Path(rel).name for rel in kit_student_files} | {Path(rel).parts[0] for rel in kit_student_files}
    wanted = {Path(rel).name: rel for rel in kit_student_files}
    candidates = set()
    for hit in _walk(folder, guarded):
        rel = wanted.get(hit.name)
        if rel and hit.as_posix().endswith("/" + rel):
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
    return find_root(path, student_files(kit_root, chosen_problems()))
