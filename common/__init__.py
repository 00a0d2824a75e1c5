"""What ``project/`` (the training entry points) and ``grading/`` (the grader) both use, kept once below both:
atomic files and JSON lines, the student regions and packages, hand-in names, warm-import lists, rank reports.
Standard library only; nothing here imports ``project`` or ``grading``.
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The folder these packages sit in: the kit, a student starter, a Gradescope bundle or a grading copy."""
