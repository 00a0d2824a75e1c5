"""The staff commands' command lines: ``release``, ``gradescope``, ``fixtures``, ``batch``.

Each refuses in one line where the staff parts are absent (a student
starter); their modules are imported only when run, so a starter, which
lacks ``release.py``, still parses every command.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from common import ROOT
from grading.commands import report, similarity
from grading.commands.options import add_course_options, add_slurm_resource_options, slurm_resources
from grading.kit.course import parse_problems
from common.regions import RegionError
from grading.kit.secret import SECRET_ENV, staff_side


def _staff_only(command: str) -> int | None:
    """EXIT_USAGE with a one-line message when ``command`` runs in a student starter (no grading/staff)."""
    if staff_side():
        return None
    print(f"error: `python -m grading {command}` is a staff command: it needs the course kit (grading/staff), "
          "which a student starter does not have", file=sys.stderr)
    return report.EXIT_USAGE


def cmd_release(args: argparse.Namespace) -> int:
    if (refused := _staff_only("release")) is not None:
        return refused
    from grading.commands.release import release
    try:
        record = release(ROOT, Path(args.out_dir), parse_problems(args.problems), preface=args.preface,
                         analysis_points=args.analysis_points)
    except (RegionError, FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return report.EXIT_USAGE
    regions = sum(len(v["regions"]) for v in record["student_files"].values())
    print(f"wrote the student starter to {args.out_dir} (Problems {', '.join(record['problems'])}): "
          f"{len(record['student_files'])} student files, {regions} regions emptied, "
          f"{len(record['provided_files'])} provided files")
    return 0


def cmd_fixtures(args: argparse.Namespace) -> int:
    if (refused := _staff_only("fixtures")) is not None:
        return refused
    from grading.staff import expected
    if args.check:
        stale = expected.stale()
        if stale:
            print(f"error: public fixtures out of date: {', '.join(stale)} (run `python -m grading fixtures`)",
                  file=sys.stderr)
            return report.EXIT_FAIL
        print("public fixtures match the staff answers")
        return 0
    written, unchanged = expected.write()
    for path in written:
        print(f"wrote {path}")
    print(f"{len(unchanged)} file(s) unchanged (they already held the staff answers)")
    return 0


def cmd_gradescope(args: argparse.Namespace) -> int:
    if (refused := _staff_only("gradescope")) is not None:
        return refused
    from grading.commands.gradescope import build_bundle
    try:
        archive = build_bundle(ROOT, Path(args.out_dir), parse_problems(args.problems),
                               args.course_secret or os.environ.get(SECRET_ENV, ""), args.total_timeout)
    except (RegionError, FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return report.EXIT_USAGE
    print(f"wrote the Gradescope autograder {archive} (unpacked in {Path(args.out_dir) / 'source'}); "
          "upload the zip as the assignment's autograder")
    return 0


def cmd_batch(args: argparse.Namespace) -> int:
    if args.run_task:
        return _batch_task(args)
    if args.collect:
        return _batch_collect(args)
    from grading.commands.batch import run_batch
    if not args.submissions_dir or not Path(args.submissions_dir).is_dir():
        print(f"error: {args.submissions_dir or 'SUBMISSIONS_DIR'}: not a folder", file=sys.stderr)
        return report.EXIT_USAGE
    extra = [*(["--problem", args.problem] if args.problem else []),
             *(["--timeout", str(args.timeout)] if args.timeout is not None else [])]
    if args.slurm:
        return _batch_slurm(args, extra)
    if not args.out:
        print("error: batch needs --out grades.csv (or --slurm OUT_DIR, or --collect OUT_DIR --out grades.csv)",
              file=sys.stderr)
        return report.EXIT_USAGE
    rows = run_batch(Path(args.submissions_dir), Path(args.out), jobs=args.jobs, grade_args=extra,
                     results_dir=Path(args.results) if args.results else None,
                     progress=None if args.quiet else lambda line: print(line, file=sys.stderr))
    from grading.commands.class_report import report_paths
    results = Path(args.results) if args.results else Path(args.out).with_name(Path(args.out).stem + "_results")
    print(f"graded {len(rows)} submission(s) into {args.out}; class report: {report_paths(Path(args.out))['html']}; "
          f"each submission's results.json and report: {results}/")
    if args.similarity:
        return _similarity(Path(args.submissions_dir), args)
    return 0


def _similarity(submissions_dir: Path, args: argparse.Namespace) -> int:
    from grading.commands.class_report import report_paths
    return similarity.run(submissions_dir, Path(args.similarity), class_report=report_paths(Path(args.out))["html"])


def _batch_slurm(args: argparse.Namespace, grade_args: list[str]) -> int:
    from grading.commands.slurm import write_array
    try:
        job = write_array(Path(args.submissions_dir), Path(args.slurm), grade_args, partition=args.partition,
                          gpus_per_task=args.gpus_per_task if args.gpus_per_task is not None
                          else (2 if args.benchmarks else 0), time_limit=args.time, benchmarks=args.benchmarks,
                          max_parallel=args.max_parallel, **slurm_resources(args))
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return report.EXIT_USAGE
    print(f"wrote {job.script} ({job.count} array tasks) and {job.tasks}; submit with:\n  {job.submit}\n"
          f"then merge with: python -m grading batch --collect {args.slurm} --out grades.csv")
    return 0


def _batch_task(args: argparse.Namespace) -> int:
    from grading.commands.slurm import run_task
    out_dir, task = args.run_task
    if not task.isdigit():
        print(f"error: --run-task OUT_DIR ID: ID must be a task number, got {task!r}", file=sys.stderr)
        return report.EXIT_USAGE
    return run_task(Path(out_dir), int(task))


def _batch_collect(args: argparse.Namespace) -> int:
    from grading.commands.slurm import collect
    if not args.out:
        print("error: --collect needs --out grades.csv", file=sys.stderr)
        return report.EXIT_USAGE
    try:
        found = collect(Path(args.collect), Path(args.out))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return report.EXIT_USAGE
    for kind, tasks in (("failed", found.failed), ("missing", found.missing)):
        for task_id, name, why in tasks:
            print(f"{kind}: task {task_id} {name}: {why}", file=sys.stderr)
    print(f"merged {len(found.rows)} finished task(s) into {args.out}; {len(found.failed)} failed, "
          f"{len(found.missing)} missing")
    if found.resubmit:
        print(f"re-run just those ({Path(args.collect) / 'resubmit.sh'}):\n  {found.resubmit}")
    if args.similarity:
        _similarity(Path(args.submissions_dir) if args.submissions_dir else found.submissions_dir, args)
    return 0 if found.complete else report.EXIT_FAIL


def generated_pages() -> dict[Path, str]:
    """The staff pages written from the kit's own declarations: path -> text."""
    from grading.commands.settings_page import settings_markdown
    from grading.commands.variants import clause_map
    return {ROOT / "docs" / "clauses.md": clause_map(), ROOT / "docs" / "settings.md": settings_markdown()}


def cmd_docs(args: argparse.Namespace) -> int:
    if (refused := _staff_only("docs")) is not None:
        return refused
    stale = []
    for target, text in generated_pages().items():
        if args.check:
            fresh = target.is_file() and target.read_text() == text
            print(f"{target}: {'up to date' if fresh else 'stale: run python -m grading docs'}")
            stale += [] if fresh else [target]
        else:
            target.write_text(text)
            print(f"wrote {target}")
    return report.EXIT_FAIL if stale else 0


def cmd_mutants(args: argparse.Namespace) -> int:
    if (refused := _staff_only("mutants")) is not None:
        return refused
    from grading.commands.mutants import HTML_NAME, run_mutants, selection, table
    try:
        result = run_mutants(Path(args.out), selection(args.problem) if args.problem else None, args.sample,
                             args.seed, args.jobs, args.timeout, args.fresh, None if args.quiet else print)
    except (RegionError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return report.EXIT_USAGE
    print("\n".join(table(result)))
    print(f"report: {Path(args.out) / HTML_NAME}")
    return 0 if result["complete"] else report.EXIT_FAIL


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``release``, ``gradescope``, ``fixtures``, ``docs``, ``batch`` and ``mutants`` to the CLI."""
    _add_release(subparsers)
    _add_gradescope(subparsers)
    _add_fixtures(subparsers)
    _add_docs(subparsers)
    _add_batch(subparsers)
    _add_mutants(subparsers)


def _add_release(subparsers: argparse._SubParsersAction) -> None:
    """``release OUT_DIR``: the student starter."""
    rel = subparsers.add_parser("release", help="write the student starter (staff)")
    rel.add_argument("out_dir")
    rel.add_argument("--problems", default="1,2,3", help="the problems this course hands out (default 1,2,3)")
    rel.add_argument("--preface", metavar="FILE", help="a UTF-8 text file put first in the starter's README "
                     "(course name, deadline, policies)")
    rel.add_argument("--analysis_points", type=float, default=0.0, metavar="N",
                     help="points the course gives the written analysis (submit_figures/analysis.md), graded by "
                     "the staff; stated in the handout (default 0: ungraded unless the staff say so)")
    rel.set_defaults(func=cmd_release)


def _add_gradescope(subparsers: argparse._SubParsersAction) -> None:
    """``gradescope OUT_DIR``: the Gradescope autograder."""
    bundle = subparsers.add_parser("gradescope", help="write the Gradescope autograder (setup.sh, run_autograder, zip)")
    bundle.add_argument("out_dir")
    bundle.add_argument("--total_timeout", type=int, default=540,
                        help="seconds the whole grade may take before it is reported as out of time (default 540, "
                        "inside Gradescope's default 10-minute limit; Gradescope's limit must be above it)")
    bundle.add_argument("--problems", default="1,2,3", help="the problems this course grades (default 1,2,3)")
    bundle.add_argument("--course-secret", help="derive the hidden inputs from this secret (stored in the bundle "
                        f"only, never in a starter); default: ${SECRET_ENV}")
    bundle.set_defaults(func=cmd_gradescope, keeps_secret=True)


def _add_fixtures(subparsers: argparse._SubParsersAction) -> None:
    """``fixtures``: the public expected values."""
    fixtures = subparsers.add_parser("fixtures", help="write the public expected values from the staff answers (staff)")
    fixtures.add_argument("--check", action="store_true", help="only check that they are up to date")
    fixtures.set_defaults(func=cmd_fixtures)


def _add_docs(subparsers: argparse._SubParsersAction) -> None:
    """``docs``: the generated staff pages (docs/clauses.md, docs/settings.md)."""
    docs = subparsers.add_parser("docs", help="write docs/clauses.md (the contract clause map, from every "
                                 "sub-problem's variants) and docs/settings.md (from common/settings.py) (staff)")
    docs.add_argument("--check", action="store_true", help="only check that they are up to date")
    docs.set_defaults(func=cmd_docs)


def _add_batch(subparsers: argparse._SubParsersAction) -> None:
    """``batch SUBMISSIONS_DIR``: grade a class here, or as a Slurm array (``_add_slurm_options``)."""
    batch = subparsers.add_parser("batch", help="grade every submission (folder or zip) in a folder into a CSV "
                                  "(here, or as a Slurm array job)")
    batch.add_argument("submissions_dir", nargs="?", help="folder of submissions (not needed with --collect)")
    batch.add_argument("--out", help="the CSV file to write (the class report goes next to it)")
    batch.add_argument("--jobs", type=int, default=1, help="submissions graded at the same time (default 1)")
    batch.add_argument("--results", help="folder for each submission's results.json and report "
                       "(default: next to the CSV, <name>_results/)")
    batch.add_argument("--problem", help="only this problem, e.g. 1.2 or 1")
    batch.add_argument("--timeout", type=float, help="limit per case in seconds (an idle machine's clock)")
    batch.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    add_course_options(batch)
    batch.add_argument("--similarity", metavar="DIR", help="also write the similarity report (pairs.csv, index.html)")
    _add_slurm_options(batch)
    batch.set_defaults(func=cmd_batch)


def _add_slurm_options(batch: argparse.ArgumentParser) -> None:
    """``batch``'s options for a Slurm array job (``slurm.write_array``), its tasks and their collection."""
    slurm = batch.add_argument_group("Slurm array job (one task per submission)")
    slurm.add_argument("--slurm", metavar="OUT_DIR", help="write OUT_DIR/grade.sbatch and the task list instead of "
                       "grading here; prints the sbatch command")
    slurm.add_argument("--partition", help="#SBATCH --partition")
    slurm.add_argument("--gpus-per-task", type=int, help="#SBATCH --gpus-per-task (default 2 with --benchmarks, "
                       "else none)")
    slurm.add_argument("--time", help="per-task time limit, HH:MM:SS (default: the grade limit, plus the "
                       "benchmark's with --benchmarks, plus slack)")
    slurm.add_argument("--benchmarks", action="store_true", help="each task also scores the GPU benchmark "
                       "thresholds (python -m grading benchmarks)")
    slurm.add_argument("--max-parallel", type=int, help="at most K tasks at once (the array's %%K)")
    add_slurm_resource_options(slurm)
    slurm.add_argument("--collect", metavar="OUT_DIR", help="merge the finished tasks of OUT_DIR into --out, list "
                       "the missing and failed ones, write OUT_DIR/resubmit.sh for them")
    slurm.add_argument("--run-task", nargs=2, metavar=("OUT_DIR", "ID"), help="grade one task of OUT_DIR "
                       "(what grade.sbatch runs)")


def _add_mutants(subparsers: argparse._SubParsersAction) -> None:
    """``mutants --out DIR``: grade the reference's in-region mutants."""
    mutants = subparsers.add_parser("mutants", help="grade the reference's in-region mutants: how strong each "
                                    "sub-problem's checks are (staff; needs requirements-staff.txt)")
    mutants.add_argument("--out", required=True, help="folder for the report (mutants.html, mutants.json), the "
                         "ledger a stopped run goes on from, and each mutant's grade")
    mutants.add_argument("--problem", help="only these problems or sub-problems, e.g. 1.2 or 1,2 (default: all)")
    mutants.add_argument("--sample", type=int, metavar="N", help="only N mutants per sub-problem, drawn with --seed")
    mutants.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    mutants.add_argument("--jobs", type=int, default=1, help="mutants graded at the same time (default 1)")
    mutants.add_argument("--timeout", type=float, help="limit per mutant's grade in seconds (default: its "
                         "sub-problem's grade limit)")
    mutants.add_argument("--fresh", action="store_true", help="grade every mutant again, ignoring --out's ledger")
    mutants.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    mutants.set_defaults(func=cmd_mutants)
