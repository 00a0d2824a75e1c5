"""Options several commands share: which problems, the course secret, and the resources of a Slurm task."""
from __future__ import annotations

import argparse
import os

from common.settings import PROBLEMS_ENV, SECRET_ENV
from grading.kit.course import parse_problems

# What a Slurm task of ``batch --slurm`` asks for by default: 2 CPUs let a grade's two ranks run side by side, and
# 3G leaves room above a full grade's footprint (docs/design.md, "Measurements") for a hungrier submission.
DEFAULT_CPUS = 2
DEFAULT_MEM = "3G"


def add_course_options(parser: argparse.ArgumentParser) -> None:
    """``--problems`` and ``--course-secret`` on ``parser``."""
    parser.add_argument("--problems", dest="course_problems", help="grade these problems (default: the course's "
                        "choice in grading/course.json, else 1,2,3), e.g. 1,2,3,4")
    parser.add_argument("--course-secret", help=f"derive the hidden inputs from this secret (default: ${SECRET_ENV})")


def apply_course_options(args: argparse.Namespace) -> None:
    """Put --problems and --course-secret in the environment, where every case builder (and batch child) reads them
    (``common.settings.settings()`` sees the new problems at its next call: its cache is keyed by the values).

    Raises ValueError for an unknown problem. A command that stores the secret itself (``keeps_secret``,
    the Gradescope bundle) leaves the environment alone.
    """
    if getattr(args, "course_problems", None):
        os.environ[PROBLEMS_ENV] = ",".join(parse_problems(args.course_problems))
    if getattr(args, "course_secret", None) and not getattr(args, "keeps_secret", False):
        os.environ[SECRET_ENV] = args.course_secret


def add_slurm_resource_options(group: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """``--cpus-per-task``, ``--mem`` and ``--account`` of ``batch --slurm`` on ``group`` (defaults
    ``DEFAULT_CPUS``, ``DEFAULT_MEM``, no account; ``--partition`` is ``batch``'s own)."""
    group.add_argument("--cpus-per-task", type=int, default=DEFAULT_CPUS,
                       help=f"#SBATCH --cpus-per-task (default {DEFAULT_CPUS}, from a measured full grade)")
    group.add_argument("--mem", default=DEFAULT_MEM, help=f"#SBATCH --mem, e.g. 3G or 3000M (default {DEFAULT_MEM}, "
                       "from a measured full grade)")
    group.add_argument("--account", help="#SBATCH --account (left out when not given)")


def slurm_resources(args: argparse.Namespace) -> dict:
    """The keyword arguments of ``slurm.write_array`` that ``add_slurm_resource_options`` parsed."""
    return {"cpus_per_task": args.cpus_per_task, "mem": args.mem, "account": args.account}
