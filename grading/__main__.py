"""Command line: ``python -m grading COMMAND``; each command lives in ``grading/commands/`` with its own options.

    python -m grading grade [SUBMISSION] [--problem ID] [--json FILE] [--timeout S]
    python -m grading release OUT_DIR [--problems 1,2,3]                          (staff)
    python -m grading gradescope OUT_DIR [--problems 1,2,3] [--course-secret S]   (staff)
    python -m grading batch SUBMISSIONS_DIR --out grades.csv [--jobs N]           (staff)
    python -m grading fixtures [--check]                                          (staff)
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":      # first: the secret leaves the command line, which every user may read
    from grading.kit.secret import off_the_command_line
    _without_secret = off_the_command_line(sys.argv[1:])
    if _without_secret is not None:
        os.execv(sys.executable, [sys.executable, "-m", "grading", *_without_secret])

import argparse
import select
import signal
import threading
from pathlib import Path

from common.settings import POOL_ENV, settings
from common.startup import collect_less
from grading.commands import benchmarks, grade, manage, report, similarity
from grading.commands.options import apply_course_options


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the command; returns the process exit code."""
    collect_less()
    parser = argparse.ArgumentParser(prog="python -m grading", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (grade, manage, similarity, benchmarks):
        command.register(sub)
    args = parser.parse_args(argv)
    try:
        apply_course_options(args)
        settings()                  # a bad GRADING_* / KIT_* value: one line naming it, before any work
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


def main_warm(argv: list[str]) -> int:
    """Run ``grade`` warm where a pool of fork servers is named (``POOL_ENV``: ``batch`` names its own, the tests
    theirs): one of them forks it with the libraries it has imported, in this process's folder, environment and
    streams; this process waits for it, passes on SIGINT, SIGTERM and SIGHUP, and ends as it ends (when this
    process is killed, the server kills the grade and everything under it). Any other command, no pool, or a
    pool that does not answer: ``main`` here."""
    from common.forkserver import ServerSession
    from grading.engine.run_servers import pool_addresses
    pool = pool_addresses(os.environ.get(POOL_ENV, ""))
    try:
        cold = not settings().fork_server
    except ValueError:                  # a bad setting: ``main`` says which
        cold = True
    if argv[:1] != ["grade"] or not pool or cold:
        return main(argv)
    try:
        session = ServerSession(pool[0])
    except OSError:
        return main(argv)
    try:
        pid = session.start("grading.__main__", argv, Path.cwd(), dict(os.environ), (1, 2))
    except (OSError, RuntimeError):
        session.close()                           # nothing of it goes on beside the cold grade
        return main(argv)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda signum, frame: os.kill(pid, signum))
    while session.alive() and pid not in session.exits:
        select.select([session], [], [], 1.0)
    code = session.exits.get(pid)
    session.close()
    if code is None:
        print("error: the grading server ended before the grade did", file=sys.stderr)
        return 70
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    if sys.argv[1:2] == ["grade"]:      # its --total-timeout counts from here, as an outer `timeout` does
        import psutil
        os.environ[grade.STARTED_ENV] = repr(psutil.Process().create_time())
    sys.exit(main_warm(sys.argv[1:]))
