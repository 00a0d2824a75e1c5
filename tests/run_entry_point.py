"""Run an entry point script as its own process, as ``python SCRIPT ARGS`` would, with a fault set up first.

    python -m tests.run_entry_point [--warnings ACTION] [--file_size_limit BYTES] [--prelude CODE] SCRIPT [ARG ...]

Test-only (the starter does not ship it): ``tests/test_faults_runs.py`` starts
its real runs of ``project/run_data_parallel.py`` and ``project/plot.py`` with
``tests.commands.run_kit_command(..., module="tests.run_entry_point")``, so
that they are forked by the test session's zygotes (no new interpreter
importing torch and transformers again) and still end as a process of their
own: a real SIGKILL, a real ``RLIMIT_FSIZE`` write error, an exit code and
stderr of their own. In this order:

- ``--warnings ACTION`` (e.g. ``ignore``): what ``PYTHONWARNINGS=ACTION``
  does at start-up, without being a start-up setting (a zygote refuses a
  command whose ``PYTHON*`` settings differ from its own): the filter here,
  ``PYTHONWARNINGS`` in the environment and ``-W`` for the processes the run
  starts (multiprocessing's resource tracker and fork server, the ranks);
- ``--file_size_limit BYTES``: ``RLIMIT_FSIZE`` for this process and what it
  starts (a write past it fails with ``EFBIG``; Python ignores ``SIGXFSZ``);
- ``--prelude CODE``: Python run first, in a namespace of its own (e.g. one
  that wraps ``project.checkpoint.save_file`` to kill the process mid-save);
- then ``SCRIPT`` as ``__main__`` (``runpy.run_path``) with ``sys.argv =
  [SCRIPT, ARG ...]`` and the script's folder first on ``sys.path``, as
  ``python SCRIPT`` has it (the working folder, the kit, stays next, for the
  prelude's imports). Its exit code is the process's.
"""
from __future__ import annotations

import argparse
import os
import resource
import runpy
import sys
import warnings


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.run_entry_point",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--warnings", metavar="ACTION", help="as PYTHONWARNINGS=ACTION at start-up (e.g. ignore)")
    parser.add_argument("--file_size_limit", type=int, metavar="BYTES", help="RLIMIT_FSIZE (soft and hard)")
    parser.add_argument("--prelude", default="", metavar="CODE", help="Python to run before the script")
    parser.add_argument("script", help="the script to run as __main__, e.g. project/run_data_parallel.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Set up what the options ask for, then run the script (module docstring); its ``SystemExit`` propagates."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.warnings:
        os.environ["PYTHONWARNINGS"] = args.warnings       # new interpreters started from here read it...
        sys.warnoptions.append(args.warnings)              # ...and multiprocessing passes these on as -W
        warnings.simplefilter(args.warnings)               # this process
    if args.file_size_limit is not None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.file_size_limit, args.file_size_limit))
    sys.argv = [args.script, *args.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    if args.prelude:
        exec(compile(args.prelude, "<prelude>", "exec"), {"__name__": "__prelude__"})
    runpy.run_path(args.script, run_name="__main__")


if __name__ == "__main__":
    main()
