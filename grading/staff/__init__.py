"""Staff-only part of the grader: never in the student starter (``grading release`` leaves it out).

    expected.py         writes and checks every folder's ``expected.json`` from its ``staff.py`` answers
    README.student.md   the common part of the starter's README (the handout), filled in at release
    handout/            the handout's other parts: a section per problem, the FAQ, figures, points from the rubric
    course_secret.txt   only in a Gradescope bundle: the secret the hidden inputs are drawn from

Each sub-problem's own staff part is ``grading/problems/<folder>/staff.py``
(answers, hidden inputs, hidden criteria); release leaves those out too.
The Gradescope bundle (``grading gradescope``) carries all of it, so the
course's grader runs the hidden checks; a student's local grade does not.
"""
