"""What ``project/`` (the training entry points) and ``grading/`` (the grader) both use, kept once below both:
atomic files and JSON lines, the student regions and packages, hand-in names, warm-import lists, rank reports.
Standard library only; nothing here imports ``project`` or ``grading``.
"""
