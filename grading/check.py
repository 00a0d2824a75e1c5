"""What a check author imports: the one surface of the grader for ``grading/problems/pX_Y_name/*.py``.

A folder's modules (checks, probes, reference, hints, staff) import the grader from here only, never from
``grading.kit`` or ``grading.engine`` (``tests/kit/test_layout.py`` holds them to it); this module implements
nothing, it re-exports. The groups of ``__all__``:

- Declaring a sub-problem: ``PROBLEM = SubProblem(ID, TITLE, __package__, inputs=..., expected_type=...)`` in
  ``checks.py``, its cases (``PROBLEM.case``; ``next_phases=`` of ``Phase``: probes that new ranks run next) and
  criteria (``@CASE.criterion``); ``PUBLIC`` and ``HIDDEN`` name the splits (``expected_in_ranks=``);
  ``staff.py`` adds ``HIDDEN_SPAWN = Spawn(...)`` when the hidden inputs need another world size.
  ``grading/kit/problem.py`` says what a folder holds.
- Judging, in the parent: a criterion reads one split's results from its ``SplitRun`` (``run.part(name, rank)``,
  ``run.inputs``, ``run.expected``) and says no with ``expect(condition, message)`` or ``raise CheckFailed``.
- Comparing tensors: ``assert_tensor_close`` / ``assert_state_close`` / ``assert_ranks_close`` fail with the
  quantity, rank and max abs diff; ``describe`` / ``describe_kind`` name a value in a message.
- Seams, in a rank: a probe replaces a student function another one calls with a grader stand-in that is no
  readable solution: a ``Swap`` in its module's ``SWAPS``, installed by ``apply``; ``Recorded`` answers from a
  table of recorded results.
- Probing, in a rank: a probe records with the ``ctx`` it is given (``ctx.record``, ``PROBLEM.each_split``); an
  exception it catches itself it reports with ``describe_exception`` (type, message, student ``file:line``,
  likely cause; ``student_frame`` is the ``file:line`` alone); ``LoadClock`` scales a limit to the machine's load.
"""
from __future__ import annotations

from grading.engine.expect import CheckFailed, expect
from common.error_words import describe_exception, student_frame
from common.cpus import LoadClock
from grading.engine.rubric import HIDDEN, PUBLIC, Phase, SplitRun
from grading.kit.compare import assert_ranks_close, assert_state_close, assert_tensor_close, describe, describe_kind
from grading.kit.problem import Spawn, SubProblem
from grading.kit.seams import Recorded, Swap, apply

__all__ = [
    # declaring a sub-problem (checks.py, staff.py)
    "SubProblem", "Phase", "Spawn", "PUBLIC", "HIDDEN",
    # what a criterion judges with, and how it says no
    "SplitRun", "CheckFailed", "expect",
    # comparing tensors, naming values in messages
    "assert_tensor_close", "assert_state_close", "assert_ranks_close", "describe", "describe_kind",
    # seams: grader stand-ins a probe installs for a student function
    "Swap", "Recorded", "apply",
    # what a probe reports a caught student exception with, and a limit fair to a loaded machine
    "describe_exception", "student_frame", "LoadClock",
]
