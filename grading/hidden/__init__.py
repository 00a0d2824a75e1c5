"""Staff-only part of the grader: never in the student starter (``grading release`` leaves it out).

    answers.py   the staff references: code that computes what a student function must return
    inputs.py    hidden inputs of every problem, derived from the course secret, with their expected values
    fixtures.py  writes and checks the public fixtures (grading/fixtures/*.json) from answers.py

The Gradescope bundle (``grading gradescope``) carries this package, so the
course's grader runs the hidden checks; a student's local grade does not.
"""
