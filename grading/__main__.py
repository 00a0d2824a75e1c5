"""Command line: ``python -m grading grade|list|release|gradescope|batch|fixtures|similarity|benchmarks``.

    python -m grading grade [SUBMISSION] [--problem ID] [--json FILE] [--timeout S]
    python -m grading list
    python -m grading release OUT_DIR [--problems 1,2,3]                 (staff)
    python -m grading gradescope OUT_DIR [--problems 1,2,3] [--course-secret S]   (staff)
    python -m grading batch SUBMISSIONS_DIR --out grades.csv [--jobs N]  (staff)
    python -m grading fixtures [--check]                                 (staff)

Each command lives in ``grading/commands/`` and registers its own options.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading

from grading.commands import benchmarks, grade, manage, report, similarity
from grading.commands.options import apply_course_options


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the command; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m grading", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (grade, manage, similarity, benchmarks):
        command.register(sub)
    args = parser.parse_args(argv)
    try:
        apply_course_options(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return report.EXIT_USAGE
    if threading.current_thread() is not threading.main_thread():
        return args.func(args)
    # SIGTERM (e.g. from `timeout`) unwinds like an exception, so every launch kills its ranks on the way out
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return args.func(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
