"""Staff-only part of the grader: never in the student starter (``grading release`` leaves it out).

    expected.py         writes and checks every folder's ``expected.json`` from its ``staff.py`` answers
    README.student.md   the common part of the starter's README (the handout), filled in at release
    handout/            the handout's other parts: a section per problem, the FAQ, figures, points from the rubric
    course_secret.txt   only in a Gradescope bundle: the secret the hidden inputs are drawn from
"""
