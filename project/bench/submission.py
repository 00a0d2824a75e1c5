"""The submission zip: exactly the student-editable files plus the benchmark figures.

    python -m project.bench.submission [--figures_dir submit_figures] [--output submission.zip]
    (what scripts/create_submission_zip.sh runs)

The zip holds, at its root, every file with ``BEGIN_STUDENT`` regions (the
grader's own list, ``grading.kit.regions.student_files``) and
``submit_figures/*.png`` + ``performance_summary.json``. Nothing else, so no
``workdir/``, checkpoints, caches or virtual environments can slip in.
Packaging is refused when a required figure or the summary is missing,
empty or not what it claims to be (a PNG that is not a PNG, a summary that
is not JSON or does not list the figure).
"""
from __future__ import annotations

import argparse
import json
import sys
import zipfile
from pathlib import Path

from grading.kit.files import atomic_path
from project.bench import REQUIRED_FIGURES, REQUIRED_FILES, SUMMARY_NAME

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIGURES_ARCDIR = "submit_figures"


class PackagingError(ValueError):
    """The submission cannot be packaged; the message says what is missing and how to make it."""


def figure_files(figures_dir: Path) -> list[Path]:
    """The files of ``figures_dir`` that go into the zip (PNGs and the summary), after checking them.

    Raises PackagingError naming every missing or broken required file.
    """
    figures_dir = Path(figures_dir)
    problems = []
    for name in REQUIRED_FILES:
        path = figures_dir / name
        if not path.is_file() or path.is_symlink() or path.stat().st_size == 0:
            problems.append(f"{path} is missing or empty")
        elif name.endswith(".png") and path.read_bytes()[:8] != PNG_SIGNATURE:
            problems.append(f"{path} is not a PNG file")
    summary_path = figures_dir / SUMMARY_NAME
    if summary_path.is_file() and summary_path.stat().st_size:
        try:
            listed = json.loads(summary_path.read_text()).get("figures", [])
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
            problems.append(f"{summary_path} is not a JSON object ({exc})")
        else:
            problems += [f"{summary_path} does not list {name} (figures from another run?)"
                         for name in REQUIRED_FIGURES if name not in listed]
    if problems:
        raise PackagingError("cannot package the submission:\n  " + "\n  ".join(problems) +
                             "\nrun `python scripts/run_benchmarks.py` first; it writes these files")
    return sorted(p for p in figures_dir.iterdir()
                  if p.is_file() and not p.is_symlink() and p.suffix in (".png", ".json"))


def create_zip(root: Path, figures_dir: Path, output: Path) -> list[str]:
    """Write ``output`` from the kit at ``root``; return the member names.

    Raises PackagingError (figures) or ``grading.kit.regions.RegionError``
    (malformed student markers) before writing anything.
    """
    from grading.kit.regions import student_files

    root = Path(root)
    members = [(root / rel, rel) for rel in student_files(root)]
    members += [(path, f"{FIGURES_ARCDIR}/{path.name}") for path in figure_files(figures_dir)]
    with atomic_path(output) as scratch, zipfile.ZipFile(scratch, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, name in members:
            archive.write(path, name)
    return [name for _, name in members]


def main(argv: list[str] | None = None) -> int:
    """CLI: package, print the members; exit 1 (with the reason) when packaging is refused."""
    from grading.kit.regions import RegionError

    root = Path(__file__).resolve().parents[2]
    parser = argparse.ArgumentParser(prog="create_submission_zip.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--figures_dir", default=str(root / FIGURES_ARCDIR))
    parser.add_argument("--output", default=str(root / "submission.zip"))
    args = parser.parse_args(argv)
    try:
        names = create_zip(root, Path(args.figures_dir), Path(args.output))
    except (PackagingError, RegionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.output} with {len(names)} files:")
    for name in names:
        print(f"  {name}")
    print(f"check it with: python -m grading grade {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
