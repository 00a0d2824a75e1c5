"""Run cases against a kit tree and turn their results into scored criteria."""
from __future__ import annotations

import json
import os
import re
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from grading.engine.expect import CheckFailed
from grading.engine.case_run import CaseRun
from grading.engine.forkserver import POOL_ENV, ForkServers
from grading.engine.launch import LaunchResult, launch, pick_backend
from grading.engine.rubric import Case, selects

# The starter's stub message ("NotImplementedError: Problem 1.2: ..."); a bare NotImplementedError raised
# by torch (e.g. copying out of a meta tensor) is a failure, not unfinished work.
FORKSERVER_ENV = "GRADING_FORKSERVER"        # "0": every rank a cold interpreter (e.g. to compare)
NOT_IMPLEMENTED = re.compile(r"NotImplementedError: Problem \d+\.\d+")


@dataclass
class CriterionResult:
    """The verdict on one criterion: points earned and why."""

    id: str
    problem: str
    title: str
    max_score: float
    score: float
    status: str        # "passed" | "failed" | "not_implemented" | "grader_error"
    message: str
    seconds: float
    hidden: bool = False

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def run_case(case: Case, kit_root: Path, work_dir: Path | None = None, timeout_scale: float = 1.0,
             backend: str = "auto", barred: dict[str, str] | None = None,
             hints: dict[str, list[str]] | None = None, servers: ForkServers | None = None) -> list[CriterionResult]:
    """Spawn ``case`` with ``kit_root`` as the code under test and judge each criterion.

    ``work_dir`` receives the run folder (a fresh temporary one when None).
    ``servers`` are the run's fork servers for ``kit_root`` (``warm_servers``); without, every rank starts cold.
    ``barred`` maps a problem ("1.2") to the reason it scores zero (its region
    code reaches into the grader): its criteria fail with that reason, and a
    case whose criteria are all barred is not run. ``hints`` maps a problem to
    likely causes read from its code; they are added to its failed criteria. Never raises for anything
    the submission does; an exception inside a criterion's own code is
    reported as status ``grader_error``.
    """
    if all(c.problem in (barred or {}) for c in case.criteria):
        return judge_case(case, None, barred)
    if work_dir is None:
        with tempfile.TemporaryDirectory(prefix="grading-") as scratch:
            return run_case(case, kit_root, Path(scratch), timeout_scale, backend, barred, hints, servers)
    return judge_case(case, _launch(case, kit_root, work_dir, timeout_scale, backend, servers), barred, hints)


def _launch(case: Case, kit_root: Path, work_dir: Path, timeout_scale: float, backend: str,
            servers: ForkServers | None) -> LaunchResult:
    """Run ``case``'s ranks on ``kit_root`` into ``work_dir/<case name>``."""
    first, *then = case.phases
    return launch(first, case.world_size, cwd=Path(kit_root), out_dir=Path(work_dir) / case.name,
                  args=case.args, timeout_s=case.timeout_s * timeout_scale, init_group=case.init_group,
                  backend=pick_backend(case.world_size, backend), servers=servers, preload=case.preload,
                  then=tuple(then), collective_checks=case.collective_checks)


def judge_case(case: Case, result: LaunchResult | None, barred: dict[str, str] | None = None,
               hints: dict[str, list[str]] | None = None) -> list[CriterionResult]:
    """Judge every criterion of ``case`` on its finished launch ``result`` (None: every criterion is barred;
    see ``run_case``); never raises."""
    barred = barred or {}
    run = CaseRun(case.world_size, result)
    judging = time.perf_counter()
    verdicts = []
    for criterion in case.criteria:
        if criterion.problem in barred:
            status, message = "failed", barred[criterion.problem]
        else:
            try:
                criterion.evaluate(run)
                status, message = "passed", ""
            except CheckFailed as failure:
                message = str(failure)
                status = "not_implemented" if NOT_IMPLEMENTED.search(message) else "failed"
                extra = [h for h in (hints or {}).get(criterion.problem, []) if h not in message]
                message = "\n".join([message, *extra])
            except Exception:  # noqa: BLE001 - a bug in a criterion must not stop the grading run
                status, message = "grader_error", "grader error while judging:\n" + traceback.format_exc()[-1500:]
        seconds = result.wall_s if result is not None and criterion.problem not in barred else 0.0
        verdicts.append(CriterionResult(criterion.id, criterion.problem, criterion.title, criterion.points,
                                        criterion.points if status == "passed" else 0.0, status, message, seconds,
                                        criterion.hidden))
    if result is not None:
        (result.out_dir / "judged.json").write_text(json.dumps({"judge_s": time.perf_counter() - judging}))
    return verdicts


def warm_servers(kit_root: Path) -> ForkServers | None:
    """Fork servers for a grading run on ``kit_root`` (close them after the run): those ``GRADING_FORKSERVER_POOL``
    names (a ``batch``'s) while they answer, else the run's own; None when ``GRADING_FORKSERVER=0`` asks for cold
    rank processes."""
    if os.environ.get(FORKSERVER_ENV, "1") == "0":
        return None
    return ForkServers(kit_root, pool=os.environ.get(POOL_ENV, ""))


def run_cases(cases: list[Case], kit_root: Path, work_dir: Path | None = None, problem: str | None = None,
              timeout_scale: float = 1.0, progress=None, barred: dict[str, str] | None = None,
              hints: dict[str, list[str]] | None = None, servers: ForkServers | None = None) -> list[CriterionResult]:
    """Run every case that has a criterion of ``problem`` (all when None); return the verdicts in rubric order.

    While one case's criteria are judged (in a helper thread of this process), the next case's ranks already
    run. ``servers``: fork servers already started for ``kit_root`` (the caller closes them); by default the
    run starts its own (``warm_servers``) and closes them at the end.
    """
    if work_dir is None:
        with tempfile.TemporaryDirectory(prefix="grading-") as scratch:
            return run_cases(cases, kit_root, Path(scratch), problem, timeout_scale, progress, barred, hints, servers)
    owned = servers is None
    servers = warm_servers(kit_root) if owned else servers
    pending = []
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="judge") as judges:
            for case in cases:
                if not any(selects(problem, c.problem) for c in case.criteria):
                    continue
                if progress:
                    progress(case)
                if all(c.problem in (barred or {}) for c in case.criteria):
                    pending.append(judge_case(case, None, barred))
                    continue
                result = _launch(case, kit_root, work_dir, timeout_scale, "auto", servers)
                pending.append(judges.submit(judge_case, case, result, barred, hints))
    finally:
        if owned and servers is not None:
            servers.close()
    verdicts = [v for item in pending for v in (item if isinstance(item, list) else item.result())]
    return [v for v in verdicts if selects(problem, v.problem)]
