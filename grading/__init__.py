"""The autograder: runs student code in rank processes and judges what they record, in this process.

    __main__.py  the CLI; each command lives in commands/ (grade, release, gradescope, batch and Slurm, reports)
    engine/      launch ranks (warm fork servers), sandbox them, record and sign in the rank, judge in the parent
    kit/         splicing, submissions, course choice, points, seams, the course secret, typed data, SubProblem
    problems/    one folder per sub-problem (pX_Y_name: probes, criteria, reference, expected.json, staff.py)
    staff/       staff only, never released: fixture writer, the handout's sources
"""
