"""The autograder: runs student code in rank processes and judges what they record, in this process.

    __main__.py   the CLI: grade, list, release, gradescope, batch, fixtures, similarity, benchmarks
    rubric.py     plain data: problems, cases, criteria (declared in the check modules)
    course.py     which problems this course hands out (Problems 1-3 by default; 4 and 5 optional)
    checks/       one module per sub-problem: its probe (child side), SWAPS and criteria side by side
    references/   serial computations the criteria compare with (never a student function's answer)
    fixtures/     expected values of the public inputs, as data (written from hidden/answers.py)
    data.py       loads fixtures; hidden inputs on the staff side; the course secret
    seams.py      the isolation swaps (one stand-in per student function another one calls)
    launch.py     starts N rank processes (file-store rendezvous, timeouts, stack dumps, killpg)
    worker.py     one rank: sandbox limits, process group, calls the probe
    results.py    the results protocol: record/sign in the rank, verify/load in the parent
    expect.py     CheckFailed and expect: how a criterion says no
    compare.py    tensor comparisons with messages (quantity, rank, max abs diff)
    hints.py      the student file and line an error came from, and likely causes
    runner.py     runs cases and turns criteria into scored results
    regions.py    BEGIN/END_STUDENT parsing and splicing, pristine student files
    submission.py intake (zip, folder) and the grading copy; grader-access and suspicious-code checks
    release.py    the student starter (staff)        gradescope.py / batch.py: staff grading at scale
    report.py     terminal table, Gradescope JSON, exit codes
    sandbox.py    per-rank limits, network namespace, leftover killing
    similarity.py similarity report across a class   figures.py: the benchmark figures of a submission
    hidden/       staff only (never in a starter): answers, hidden inputs, fixture writer, student README
"""
from pathlib import Path

KIT_ROOT = Path(__file__).resolve().parent.parent     # the kit (or starter, or bundle) this grader belongs to
