"""Is the student code an entry point needs written yet? Checked from the source, before anything runs.

Each entry point names the problems (and, where it uses only some of a
problem's functions, which ones) it calls into. A region whose body is
still the starter's ``raise NotImplementedError("Problem <id>: ...")``, or a
file that does not parse, stops the command with one line and exit code 2::

    project/run_data_parallel.py needs Problems 1.1 and 1.2: Problem 1.2 is not implemented yet

No student code is imported or run to find this out (``grading.kit.regions``
parses the markers).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from grading.kit.regions import STUDENT_PACKAGES, RegionError, parse_regions
from project import KIT_ROOT
from project.cli import ConfigError

# problem id -> the functions (region hosts) an entry point calls, or None for every region of the problem
Needs = dict[str, "tuple[str, ...] | None"]

DATA_PARALLEL: Needs = {"1.1": None, "1.2": ("setup_process_group", "average_gradients")}
MODEL_PARALLEL: Needs = {"2.3": None}
PIPELINE_PARALLEL: Needs = {"2.1": ("clock_cycles",), "2.2": None, "2.3": None}
FINETUNE: Needs = {"1.1": None, "1.2": ("setup_process_group",), "3.1": None, "3.2": None, "3.3": None}
BENCHMARKS: Needs = {"1.1": None, "1.2": None, "2.1": ("clock_cycles",), "2.2": None, "2.3": None, "3.1": None}
# The benchmark's parts (scripts/run_benchmarks.py measures those whose problems are written, skips the rest)
BENCH_PARTS: dict[str, Needs] = {"data_parallel": DATA_PARALLEL | {"1.2": None}, "pipeline": PIPELINE_PARALLEL,
                                 "finetune": {"3.1": None}}
COMMANDS: dict[str, Needs] = {
    "project/run_data_parallel.py": DATA_PARALLEL,
    "project/run_pipeline.py --model_parallel_mode model_parallel": MODEL_PARALLEL,
    "project/run_pipeline.py --model_parallel_mode pipeline_parallel": PIPELINE_PARALLEL,
    "project/run_finetune.py": FINETUNE,
    "scripts/run_benchmarks.py": BENCHMARKS,
}


def _is_stub(body: str, problem: str) -> bool:
    code = [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith("#")]
    return len(code) == 1 and re.match(rf"raise\s+NotImplementedError\(\s*[\"']Problem {re.escape(problem)}\b",
                                       code[0]) is not None


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def problems_not_ready(needs: Needs, root: Path = KIT_ROOT, stubs_too: bool = True) -> list[str]:
    """Sentences about the needed problems that cannot run yet (empty when all are written and parse).

    A file holding a needed problem that does not parse gives ``Problem 2.2
    (pipeline/pipe.py) has a syntax error at line 12``; a needed region
    still equal to the starter's stub gives ``Problem 1.2 is not implemented
    yet``. Files with malformed markers are reported only when they mention
    a needed problem. ``stubs_too=False`` reports only files that do not parse.
    """
    stubs: set[str] = set()
    broken: list[str] = []
    for package in STUDENT_PACKAGES:
        for file in sorted((Path(root) / package).rglob("*.py")):
            rel = file.relative_to(root).as_posix()
            text = file.read_text()
            mentioned = [p for p in needs if re.search(rf"BEGIN_STUDENT\s+{re.escape(p)}\s*$", text, re.M)]
            if not mentioned:
                continue
            try:
                ast.parse(text, rel)
                regions = parse_regions(text, rel)
            except SyntaxError as exc:
                broken.append(f"Problem {_join(mentioned)} ({rel}) has a syntax error at line {exc.lineno}")
                continue
            except RegionError as exc:
                broken.append(f"Problem {_join(mentioned)}: {exc}")
                continue
            for region in regions:
                wanted = needs.get(region.id, ())
                if region.id in needs and (wanted is None or region.function in wanted) \
                        and _is_stub(region.body, region.id):
                    stubs.add(region.id)
    ordered = sorted(stubs, key=lambda p: [int(x) if x.isdigit() else x for x in p.split(".")])
    if ordered and stubs_too:
        verb = "is" if len(ordered) == 1 else "are"
        broken.append(f"Problem{'s' if len(ordered) > 1 else ''} {_join(ordered)} {verb} not implemented yet")
    return broken


def ensure_ready(command: str, needs: Needs, root: Path = KIT_ROOT, stubs_too: bool = True) -> None:
    """Raise ConfigError (one line) when a problem ``command`` needs is unwritten or does not parse.

    ``stubs_too=False`` checks only that the files parse (before importing them).
    """
    problems = problems_not_ready(needs, root, stubs_too)
    if problems:
        ids = sorted(needs, key=lambda p: [int(x) if x.isdigit() else x for x in p.split(".")])
        raise ConfigError(f"{command} needs Problem{'s' if len(ids) > 1 else ''} {_join(ids)}: "
                          f"{'; '.join(problems)}")


def problem_ids(needs: Needs) -> str:
    """``needs``' problem ids in order, as text: ``1.1 and 1.2``."""
    return _join(sorted(needs, key=lambda p: [int(x) if x.isdigit() else x for x in p.split(".")]))


def parts_not_ready(parts: dict[str, Needs], root: Path = KIT_ROOT) -> dict[str, str]:
    """``{part: why}`` for each part of ``parts`` that cannot run yet (its problems unwritten or not parsing).

    ``why`` reads ``needs Problems 2.1, 2.2 and 2.3: Problem 2.2 is not implemented yet``.
    """
    out = {}
    for part, needs in parts.items():
        problems = problems_not_ready(needs, root)
        if problems:
            out[part] = f"needs Problem{'s' if len(needs) > 1 else ''} {problem_ids(needs)}: {'; '.join(problems)}"
    return out


def ensure_some_ready(command: str, parts: dict[str, Needs], root: Path = KIT_ROOT) -> dict[str, str]:
    """``parts_not_ready(parts)``, or ConfigError (one line) when not one of ``parts`` can run.

    ``scripts/run_benchmarks.py needs Problems 1.1 and 1.2 (data_parallel) or 2.1, 2.2 and 2.3
    (pipeline): Problems 1.1, 1.2, 2.1, 2.2 and 2.3 are not implemented yet``
    """
    skipped = parts_not_ready(parts, root)
    if parts and len(skipped) == len(parts):
        either = " or ".join(f"{problem_ids(needs)} ({part})" for part, needs in parts.items())
        merged: Needs = {}
        for needs in parts.values():
            merged |= needs
        raise ConfigError(f"{command} needs Problems {either}: {'; '.join(problems_not_ready(merged, root))}")
    return skipped
