"""A run whose ranks failed or all stopped, in words: the rank at fault first, the others' errors as its symptoms.

What the entry points' launcher (``project.launch``) raises when a run ends badly. The judgement is the kit's one:
which report is a symptom (``common.rank_reports``), which call the ranks parted on (``common.call_log``), what an
error means (``common.error_words``); the grader words the same judgements per graded part
(``grading.engine.peers``).
"""
from __future__ import annotations

from common import call_log
from common.error_words import traceback_error, traceback_hint
from common.rank_reports import is_symptom, rank_at_fault


def one_line(report: str, hint: bool = False) -> str:
    """A rank's report on one line: ``failed: <exception> (at <student file:line>)`` for a traceback (in plain
    words: ``common.error_words.traceback_error``); with ``hint``, its likely cause on a next line where known.
    Any other report (how a rank died) as it is."""
    if "Traceback (most recent call last)" not in report:
        return report
    cause = traceback_hint(report) if hint else ""
    return f"failed: {traceback_error(report)}" + (f"\n{cause}" if cause else "")


def failed_run(failures: dict[int, str], logs: dict[int, list[call_log.Call]], who: str = "rank") -> str:
    """The report of a run whose ranks ``failures`` failed (rank -> its traceback, or how it died): a first line
    naming the rank at fault (``rank_at_fault``) and what it did, a ``symptom:`` line for each other failed rank,
    then the faulty rank's report. ``who`` names a rank ("rank", "worker rank").

    When every failure is a symptom (no rank failed in its own code), the ranks' collective calls ``logs``
    (``call_log.parting``) name the call on which they parted, where they show one.
    """
    fault = rank_at_fault(failures)
    parted = call_log.parting(logs) if all(is_symptom(text) for text in failures.values()) else None
    if parted:
        lines = [*parted.splitlines(), *(f"symptom: {who} {r} then {one_line(text)}"
                                         for r, text in sorted(failures.items()))]
    else:
        lines = [f"{who} {fault} {one_line(failures[fault], hint=True)}"]
        lines += [f"symptom: {who} {r} then {one_line(text)}" for r, text in sorted(failures.items()) if r != fault]
    return "\n".join([*lines, failures[fault].rstrip()])


def stuck_run(places: dict[int, str], still_s: float, logs: dict[int, list[call_log.Call]], limit: str,
              who: str = "") -> str:
    """The report of a run whose ranks all waited ``still_s`` seconds without using the CPU: the call on which
    their collective calls ``logs`` part (``call_log.parting``) first where they show one, then where each rank
    waits (``places``: rank -> ``"barrier (data_parallel/checkpoint.py:104)"``, ``RankWatch.places``) and the
    ``limit`` that ended it ("--timeout 45"); else where each waits and the likely cause. ``who``: what the
    ranks are ("worker "; "" for plain ranks)."""
    parted = call_log.parting(logs, {r: place.split(" (")[0] for r, place in places.items()})
    waited = (f"every one of the {who}ranks still running waited {still_s:.0f} s without using the CPU, so none "
              "could go on: " + ", ".join(f"rank {r} in {place}" for r, place in sorted(places.items()))
              + f" (the limit: {limit})")
    if parted:
        first, *rest = parted.splitlines()
        return "\n".join([first, f"waiting: {waited}", *rest])
    return (f"{waited}\nlikely cause: the ranks wait for each other: a collective or receive that another rank never "
            "reaches, or a loop that waits for a file or value another rank never provides")
