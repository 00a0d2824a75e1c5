"""The submission zip: exactly the student-editable files plus the benchmark figures there are.

    python -m project.bench.submission [--figures_dir submit_figures] [--output submission.zip] [--problems 1,2,3]
    (what scripts/create_submission_zip.sh runs, with the course's problems)

A missing or broken figure and an unanswered analysis are warnings, never a refusal (``create_zip``).
"""
from __future__ import annotations

import argparse
import json
import sys
import zipfile
from pathlib import Path

from common.files import atomic_path
from common.handin import ANALYSIS_NAME, ANSWER_PLACEHOLDER
from project.bench import REQUIRED_FIGURES, SUMMARY_NAME

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIGURES_ARCDIR = "submit_figures"
# which benchmark group (project.readiness.BENCH_PARTS) draws each required figure
FIGURE_PARTS = {"data_parallel.png": ("data_parallel",), "pipeline.png": ("pipeline",),
                "pipeline_timeline.png": ("pipeline",), SUMMARY_NAME: ("data_parallel", "pipeline")}


def needed_problems(name: str) -> str:
    """Which problems the benchmark needs to write ``name``: ``Problems 2.1, 2.2 and 2.3``, ``... or ...``."""
    from project.readiness import BENCH_PARTS, problem_ids

    ids = [problem_ids(BENCH_PARTS[part]) for part in FIGURE_PARTS.get(name, ())]
    return "Problems " + " or ".join(ids) if ids else "the benchmark"


def figure_files(figures_dir: Path) -> tuple[list[Path], list[str]]:
    """``(files, warnings)``: the files of ``figures_dir`` that go into the zip (PNGs and the summary).

    Never raises for what the folder holds: each missing required file
    gives a warning naming the problems it needs, each broken one (not a
    PNG, a summary that is not a JSON object) is left out with a warning, a
    summary that does not list a figure present is packaged with a warning.
    """
    figures_dir = Path(figures_dir)
    warnings: list[str] = []
    files = sorted(p for p in figures_dir.iterdir() if p.is_file() and not p.is_symlink()
                   and p.suffix in (".png", ".json") and p.stat().st_size) if figures_dir.is_dir() else []
    for path in list(files):
        if path.suffix == ".png" and path.read_bytes()[:8] != PNG_SIGNATURE:
            warnings.append(f"{path} is not a PNG file: left out")
            files.remove(path)
    listed = None
    summary_path = figures_dir / SUMMARY_NAME
    if summary_path in files:
        try:
            listed = json.loads(summary_path.read_text()).get("figures", [])
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
            warnings.append(f"{summary_path} is not a JSON object ({exc}): left out")
            files.remove(summary_path)
    names = {p.name for p in files}
    for name in REQUIRED_FIGURES + (SUMMARY_NAME,):
        if name not in names:
            warnings.append(f"{figures_dir / name} is missing: it needs {needed_problems(name)}; run "
                            "`python scripts/run_benchmarks.py` when they are done, then package again")
        elif listed is not None and name != SUMMARY_NAME and name not in listed:
            warnings.append(f"{summary_path} does not list {name} (figures from another run?)")
    return files, warnings


def analysis_file(figures_dir: Path) -> tuple[list[Path], list[str]]:
    """``([path] or [], warnings)``: the written analysis ``figures_dir/analysis.md`` if it is there and not empty.

    Never raises: a missing or empty file is a warning (and left out), one
    whose template placeholders are still there is packaged with a warning
    saying how many questions are unanswered.
    """
    path = Path(figures_dir) / ANALYSIS_NAME
    if not path.is_file() or path.is_symlink():
        return [], [f"{path} is missing: it holds your written analysis (the starter's template, answered; see the "
                    "README's Written analysis); write it, then package again"]
    text = path.read_text(errors="replace")
    if not text.strip():
        return [], [f"{path} is empty: left out; answer the questions of the starter's template, then package again"]
    open_questions = text.count(ANSWER_PLACEHOLDER)
    if open_questions:
        return [path], [f"{path} has {open_questions} question(s) still unanswered (the template's placeholder "
                        "is still there)"]
    return [path], []


def create_zip(root: Path, figures_dir: Path, output: Path, warn=lambda text: None,
               problems: tuple[str, ...] | None = None) -> list[str]:
    """Write ``output`` from the kit at ``root``; return the member names.

    The zip holds, at its root, every file with ``BEGIN_STUDENT`` regions of
    one of ``problems`` (("1", "2", "3"); None: of every problem), the grader's
    own list, ``common.regions.student_files``, and under
    ``submit_figures/`` the PNGs, ``performance_summary.json`` and
    ``analysis.md`` of ``figures_dir`` that pass ``figure_files`` and
    ``analysis_file``. Nothing else, so no ``workdir/``, checkpoints, caches or
    virtual environments can slip in. The student files are always packaged:
    a partial solution is a normal submission.
    Warnings about the figures and the analysis go to ``warn`` (the files are packaged
    anyway). Raises ``common.regions.RegionError`` (malformed student
    markers) before writing anything.
    """
    from common.regions import student_files

    root = Path(root)
    members = [(root / rel, rel) for rel in student_files(root, problems)]
    figures, warnings = figure_files(figures_dir)
    written, more = analysis_file(figures_dir)
    warnings += more
    members += [(path, f"{FIGURES_ARCDIR}/{path.name}") for path in figures + written]
    for text in warnings:
        warn(text)
    with atomic_path(output) as scratch, zipfile.ZipFile(scratch, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, name in members:
            archive.write(path, name)
    return [name for _, name in members]


def main(argv: list[str] | None = None) -> int:
    """CLI: package, print the members and the figure warnings; exit 2 (one line) only for malformed student markers."""
    from common.regions import RegionError

    root = Path(__file__).resolve().parents[2]
    parser = argparse.ArgumentParser(prog="create_submission_zip.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--figures_dir", default=str(root / FIGURES_ARCDIR))
    parser.add_argument("--output", default=str(root / "submission.zip"))
    parser.add_argument("--problems", default=None,
                        help="the course's problems, e.g. 1,2,3: only their student files are packed (default: all)")
    args = parser.parse_args(argv)
    problems = tuple(p.strip() for p in args.problems.split(",") if p.strip()) if args.problems else None
    try:
        warnings: list[str] = []
        names = create_zip(root, Path(args.figures_dir), Path(args.output), warn=warnings.append, problems=problems)
    except RegionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.output} with {len(names)} files:")
    for name in names:
        print(f"  {name}")
    print(f"check it with: python -m grading grade {args.output}", flush=True)
    for text in warnings:   # last, where they are seen; packaging never stops for a figure
        print(f"warning: {text}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
