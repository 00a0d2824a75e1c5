"""The autograder: runs student code in rank processes and judges what they record, in this process.

    __main__.py  the CLI: grade, list, release, gradescope, batch, fixtures, similarity, benchmarks
    engine/      launch ranks (warm fork servers), sandbox them, record and sign in the rank, judge in the
                 parent (rubric, runner, expect, compare, hints): every split of a case, public then hidden
    kit/         splicing, submissions, the course's chosen problems (course.py), points, seams,
                 the course secret, typed fixture data, and SubProblem: what a problem folder declares
    commands/    grade, release, gradescope, batch and Slurm, class report, similarity, benchmarks, over the engine
    problems/    one folder per sub-problem (pX_Y_name: probes, criteria, reference, expected.json, staff.py)
    staff/       staff only, never released: fixture writer, the handout's sources
"""
from pathlib import Path

KIT_ROOT = Path(__file__).resolve().parent.parent     # the kit (or starter, or bundle) this grader belongs to
