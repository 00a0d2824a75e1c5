"""Run cases against a kit tree and turn their results into scored criteria."""
from __future__ import annotations

import enum
import json
import os
import re
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from common.settings import FORKSERVER_ENV as FORKSERVER_ENV     # re-exported: tests name runner.FORKSERVER_ENV
from common.settings import POOL_ENV, settings
from grading.engine.expect import CheckFailed
from grading.engine.case_run import CaseRun, in_case_folder
from grading.engine.run_servers import ForkServers
from common.cpus import LoadClock
from grading.engine.launch import LaunchResult, launch, pick_backend
from grading.engine.rubric import Case, selects

# The starter's stub message ("NotImplementedError: Problem 1.2: ..."); a bare NotImplementedError raised
# by torch (e.g. copying out of a meta tensor) is a failure, not unfinished work.
NOT_IMPLEMENTED = re.compile(r"NotImplementedError: Problem \d+\.\d+")
NOT_GRADED = "not graded: "      # how the message of a criterion whose case never ran starts (``Status.NOT_GRADED``)
MIN_CASE_S = 1.0                 # a case whose share of a grade's total time is shorter is not started (its
                                 # criteria are ``skipped`` or ``cut``, the reason in words)


class TextEnum(str, enum.Enum):
    """An enum whose members are their text: they compare, hash, print, format and serialise (JSON, CSV) as their
    value, on every Python the kit supports (``enum.StrEnum`` needs 3.11; Gradescope's Ubuntu 22.04 has 3.10)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Status(TextEnum):
    """A criterion's verdict status. A ``str``: it compares, hashes, prints and serialises (JSON, CSV) as its value
    ("passed"). results.json's test ``status`` is Gradescope's own two values (``result_tests.GRADESCOPE_PASSED``)."""

    PASSED = "passed"                    # the criterion held: full points
    FAILED = "failed"                    # a check failed (or the problem is refused, the submission rejected)
    NOT_IMPLEMENTED = "not_implemented"  # the starter's stub raised (``NOT_IMPLEMENTED``): work not done yet
    GRADER_ERROR = "grader_error"        # the criterion's own code raised: a grader bug, not the submission's fault
    NOT_GRADED = "not_graded"            # its case never ran or was not judged (message starts with ``NOT_GRADED``)
    NOT_APPLICABLE = "not_applicable"    # a benchmark threshold that does not apply to the run (no points)


@dataclass
class CriterionResult:
    """The verdict on one criterion: points earned and why."""

    id: str
    problem: str
    title: str
    max_score: float
    score: float
    status: Status
    message: str
    seconds: float
    hidden: bool = False
    hidden_kind: str = ""    # a hidden criterion's kind of input, in a student's words (``HIDDEN_KIND``)

    def __post_init__(self) -> None:
        self.status = Status(self.status)      # its text ("passed") is accepted; an unknown one is a ValueError

    @property
    def passed(self) -> bool:
        return self.status == Status.PASSED


def run_case(case: Case, code_root: Path, work_dir: Path | None = None, timeout_scale: float = 1.0,
             backend: str = "auto", refused: dict[str, str] | None = None,
             hints: dict[str, list[str]] | None = None, servers: ForkServers | None = None) -> list[CriterionResult]:
    """Spawn ``case`` with ``code_root`` as the code under test and judge each criterion.

    ``work_dir`` receives the run folder (a fresh temporary one when None).
    ``servers`` are the run's fork servers for ``code_root`` (``warm_servers``); without, every rank starts cold.
    ``refused`` maps a problem ("1.2") to the reason it scores zero (its region
    code reaches into the grader): its criteria fail with that reason, and a
    case whose criteria are all refused is not run. ``hints`` maps a problem to
    likely causes read from its code; they are added to its failed criteria. Never raises for anything
    the submission does; an exception inside a criterion's own code is
    reported as ``Status.GRADER_ERROR``.
    """
    if all(c.problem in (refused or {}) for c in case.criteria):
        return judge_case(case, None, refused)
    if work_dir is None:
        with tempfile.TemporaryDirectory(prefix="grading-") as scratch:
            return run_case(case, code_root, Path(scratch), timeout_scale, backend, refused, hints, servers)
    return judge_case(case, _launch(case, code_root, work_dir, timeout_scale, backend, servers), refused, hints)


def _launch(case: Case, code_root: Path, work_dir: Path, timeout_scale: float, backend: str,
            servers: ForkServers | None) -> LaunchResult:
    """Run ``case``'s ranks on ``code_root`` into ``work_dir/<case name>``."""
    first, *next_phases = case.phases
    return launch(first, case.world_size, cwd=Path(code_root), out_dir=Path(work_dir) / case.name,
                  args=case.args, timeout_s=case.timeout_s * timeout_scale, init_group=case.init_group,
                  backend=pick_backend(case.world_size, backend), servers=servers, preload=case.preload,
                  next_phases=tuple(next_phases), collective_checks=case.phase_checks)


def judge_case(case: Case, result: LaunchResult | None, refused: dict[str, str] | None = None,
               hints: dict[str, list[str]] | None = None) -> list[CriterionResult]:
    """Judge every criterion of ``case`` on its finished launch ``result`` (None: every criterion is refused;
    see ``run_case``); never raises."""
    refused = refused or {}
    run = CaseRun(case.world_size, result)
    judging = time.perf_counter()
    verdicts = []
    for criterion in case.criteria:
        if criterion.problem in refused:
            status, message = Status.FAILED, refused[criterion.problem]
        else:
            try:
                criterion.evaluate(run)
                status, message = Status.PASSED, ""
            except CheckFailed as failure:
                message = str(failure)
                status = Status.NOT_IMPLEMENTED if NOT_IMPLEMENTED.search(message) else Status.FAILED
                extra = [h for h in (hints or {}).get(criterion.problem, []) if h not in message]
                message = "\n".join([message, *extra, *filter(None, [run.calls_note(message)])])
            except Exception:  # noqa: BLE001 - a bug in a criterion must not stop the grading run
                status, message = Status.GRADER_ERROR, "grader error while judging:\n" + traceback.format_exc()[-1500:]
        if result is not None:
            message = in_case_folder(message, result.out_dir)
        seconds = result.wall_s if result is not None and criterion.problem not in refused else 0.0
        verdicts.append(CriterionResult(criterion.id, criterion.problem, criterion.title, criterion.points,
                                        criterion.points if status == Status.PASSED else 0.0, status, message, seconds,
                                        criterion.hidden, criterion.source.hidden_kind if criterion.source else ""))
    if result is not None:
        (result.out_dir / "judged.json").write_text(json.dumps({"judge_s": time.perf_counter() - judging}))
    return verdicts


def warm_servers(code_root: Path) -> ForkServers | None:
    """Fork servers for a grading run on ``code_root`` (close them after the run): those ``GRADING_FORKSERVER_POOL``
    names (a ``batch``'s) while they answer, else the run's own; None when ``GRADING_FORKSERVER=0`` asks for cold
    rank processes."""
    if not settings().fork_server:
        return None
    return ForkServers(code_root, pool=os.environ.get(POOL_ENV, ""))


@dataclass(frozen=True)
class TotalTime:
    """A grade's whole time: ``total_s`` wall seconds, its cases to end by ``deadline`` (``time.monotonic()``).

    The cases share it (``run_cases``): each may use what is left in proportion to its own limit among the
    limits of the cases still to run, itself included, so a hang in one problem cannot starve the next and what
    a case leaves unused passes on to the rest.
    """

    total_s: float
    deadline: float

    def share_s(self, limit_s: float, pending_s: float) -> float:
        """Wall seconds a case with limit ``limit_s`` may use now, ``pending_s`` the sum of the limits still to
        run (its own included)."""
        return max(0.0, self.deadline - time.monotonic()) * limit_s / max(pending_s, limit_s, 1e-9)

    def ran_out(self, problem: str, started: bool) -> str:
        """Why a criterion of ``problem`` whose case did not start was not graded, this total having run out: cut
        while its problem ran when another case of it had ``started``, else skipped before it started."""
        why = out_of_time(self.total_s)
        return cut_reason(why, problem) if started else skipped_reason(why, problem)


def out_of_time(total_s: float) -> str:
    """How every report says that a grade used up its total time of ``total_s`` seconds."""
    return f"the grade's total time of {total_s:g} s ran out"


def skipped_reason(why: str, problem: str) -> str:
    """The reason of a criterion whose case never started: ``why`` the grade stopped (``out_of_time``, a signal)
    came before Problem ``problem`` started."""
    return f"skipped: {why} before Problem {problem} started"


def cut_reason(why: str, problem: str | None) -> str:
    """The reason of a criterion whose case had started but was not judged: ``why`` the grade stopped came while
    Problem ``problem`` ran (its own problem, when known)."""
    return f"cut: {why}" + (f" while running Problem {problem}" if problem else "")


def not_graded(case: Case, reason: str) -> list[CriterionResult]:
    """Every criterion of ``case`` as not graded (``Status.NOT_GRADED``, no points) because of ``reason``."""
    return [CriterionResult(c.id, c.problem, c.title, c.points, 0.0, Status.NOT_GRADED, NOT_GRADED + reason, 0.0,
                            c.hidden, c.source.hidden_kind if c.source else "") for c in case.criteria]


def run_cases(cases: list[Case], code_root: Path, work_dir: Path | None = None, problem: str | None = None,
              timeout_scale: float = 1.0, progress=None, refused: dict[str, str] | None = None,
              hints: dict[str, list[str]] | None = None, servers: ForkServers | None = None,
              total: TotalTime | None = None,
              judged: Callable[[Case, list[CriterionResult], LaunchResult | None], None] | None = None
              ) -> list[CriterionResult]:
    """Run every case that has a criterion of ``problem`` (all when None); return the verdicts in rubric order.

    While one case's criteria are judged (in a helper thread of this process), the next case's ranks already
    run. ``servers``: fork servers already started for ``code_root`` (the caller closes them); by default the
    run starts its own (``warm_servers``) and closes them at the end. With ``total`` each case's limit is cut
    to its share of the time left (``TotalTime.share_s``, converted to the load clock with
    ``LoadClock.slowdown``), and a case whose share is under ``MIN_CASE_S`` is not started: its criteria are
    ``not_graded``, skipped before their problem started (``skipped_reason``), or cut while it ran when an earlier
    case of it started (``cut_reason``). ``progress(case)`` is called as a case's ranks are about to start;
    ``judged(case, verdicts, result)`` once per case as soon as its verdicts are known (from the judging thread
    too; ``result`` is its launch, None when it did not run), e.g. to keep a partial report.
    """
    if work_dir is None:
        with tempfile.TemporaryDirectory(prefix="grading-") as scratch:
            return run_cases(cases, code_root, Path(scratch), problem, timeout_scale, progress, refused, hints, servers,
                             total, judged)
    refused = refused or {}
    chosen = [case for case in cases if any(selects(problem, c.problem) for c in case.criteria)]
    to_run = {id(case) for case in chosen if not all(c.problem in refused for c in case.criteria)}
    pending_s = sum(case.timeout_s * timeout_scale for case in chosen if id(case) in to_run)
    owned = servers is None
    servers = warm_servers(code_root) if owned else servers
    pending, started = [], set()
    done = _reporting_to(judged)
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="judge") as judges:
            for case in chosen:
                if id(case) not in to_run:
                    pending.append(done(case, judge_case(case, None, refused)))
                    continue
                full_s = case.timeout_s * timeout_scale
                pending_s -= full_s
                limit_s = _case_limit_s(full_s, pending_s + full_s, total)
                if limit_s is None:     # not started: the reason, in words
                    problem_now = case.criteria[0].problem
                    pending.append(done(case, not_graded(case, total.ran_out(problem_now, problem_now in started))))
                    continue
                started.add(case.criteria[0].problem)
                if progress:
                    progress(case)
                result = _launch(replace(case, timeout_s=limit_s), code_root, work_dir, 1.0, "auto", servers)
                cut = _cut_note(full_s, limit_s, total)
                pending.append(judges.submit(_judged, case, result, refused, hints, cut, done))
    finally:
        if owned and servers is not None:
            servers.close()
    verdicts = [v for item in pending for v in (item if isinstance(item, list) else item.result())]
    return [v for v in verdicts if selects(problem, v.problem)]


def _reporting_to(judged: Callable[[Case, list[CriterionResult], LaunchResult | None], None] | None
                  ) -> Callable[..., list[CriterionResult]]:
    """``done(case, verdicts, result=None)``: tells ``judged`` (when given) a case's verdicts, returns them."""
    def done(case: Case, verdicts: list[CriterionResult], result: LaunchResult | None = None) -> list[CriterionResult]:
        if judged is not None:
            judged(case, verdicts, result)
        return verdicts
    return done


def _case_limit_s(full_s: float, pending_s: float, total: TotalTime | None) -> float | None:
    """A case's limit: ``full_s``, or with ``total`` its share of the time left (``pending_s``: the limits still to
    run, its own included) on the load clock, at most ``full_s``; None when that share is under ``MIN_CASE_S``
    (the case is not started)."""
    if total is None:
        return full_s
    share_s = total.share_s(full_s, pending_s)
    if share_s < MIN_CASE_S:
        return None
    return min(full_s, share_s / LoadClock.slowdown(recent=True))


def _cut_note(full_s: float, limit_s: float, total: TotalTime | None) -> str:
    """What a case's verdicts say when its limit was cut below ``full_s`` to fit ``total``; "" when it was not."""
    return "" if limit_s >= full_s else (f"this case's limit was cut from {full_s:g} s to {limit_s:.1f} s "
                                         f"to fit the grade's total time of {total.total_s:g} s")


def _judged(case: Case, result: LaunchResult, refused: dict[str, str], hints: dict[str, list[str]] | None, cut: str,
            done: Callable[..., list[CriterionResult]]) -> list[CriterionResult]:
    """``judge_case``, with ``cut`` (why the case ran under a shorter limit than its own) added to every failed
    verdict of a case that reached that limit; then ``done``."""
    verdicts = judge_case(case, result, refused, hints)
    if cut and result.timed_out:
        verdicts = [replace(v, message=f"{v.message}\n{cut}") if v.status == Status.FAILED else v for v in verdicts]
    return done(case, verdicts, result)
