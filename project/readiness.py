"""Is the student code an entry point needs written yet? Checked from the source, before anything runs.

A needed region still equal to the starter's stub, or a file that does not parse, stops the command with one line
and exit code 2 (``ensure_ready``); no student code is imported or run to find this out. The tables below are the
one record of what each command needs: the entry points (``COMMANDS``), the benchmark's parts (``BENCH_PARTS``) and
what each of ``scripts/run_benchmarks.py``'s flags adds (``BENCH_FLAGS``).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from common import ROOT
from common.regions import STUDENT_PACKAGES, RegionError, parse_regions
from project.cli import UniformError

# problem id -> the functions (region hosts) an entry point calls, or None for every region of the problem
Needs = dict[str, "tuple[str, ...] | None"]

DATA_PARALLEL: Needs = {"1.1": None, "1.2": ("setup_process_group", "average_gradients")}
MODEL_PARALLEL: Needs = {"2.3": None}
PIPELINE_PARALLEL: Needs = {"2.1": ("clock_cycles",), "2.2": None, "2.3": None}
FINETUNE: Needs = {"1.1": None, "1.2": ("setup_process_group",), "3.1": None, "3.2": None, "3.3": None}
CAPSTONE: Needs = {"4.1": None, "4.2": None, "4.3": None}
TENSOR_PARALLEL: Needs = {"5.1": None, "5.2": None}     # with more than one rank (one rank: the unsplit baseline)
BENCHMARKS: Needs = {"1.1": None, "1.2": None, "2.1": ("clock_cycles",), "2.2": None, "2.3": None, "3.1": None}
# The benchmark's parts (scripts/run_benchmarks.py measures those whose problems are written, skips the rest)
BENCH_PARTS: dict[str, Needs] = {"data_parallel": DATA_PARALLEL | {"1.2": None}, "pipeline": PIPELINE_PARALLEL,
                                 "finetune": {"3.1": None}}
BENCH_BASE = ("data_parallel", "pipeline")   # a benchmark run needs one of these
# What each flag of scripts/run_benchmarks.py adds to the run: (parts it measures where written, parts it needs).
# --peers adds peers to the base parts, a LoRA group and the Problem 4 group (BucketedDDP, ZeRO-1 memory);
# --tensor_parallel exists to measure Problem 5 next to data and pipeline parallelism.
DDP_ZERO: Needs = {"1.2": ("average_gradients",), "4.1": None, "4.2": None}
BENCH_FLAGS: dict[str, tuple[dict[str, Needs], dict[str, Needs]]] = {
    "--peers": ({"finetune": BENCH_PARTS["finetune"], "ddp_zero": DDP_ZERO}, {}),
    "--tensor_parallel": ({}, {"tensor_parallel": TENSOR_PARALLEL}),
}
COMMANDS: dict[str, Needs] = {
    "project/run_data_parallel.py": DATA_PARALLEL,
    "project/run_pipeline.py --model_parallel_mode model_parallel": MODEL_PARALLEL,
    "project/run_pipeline.py --model_parallel_mode pipeline_parallel": PIPELINE_PARALLEL,
    "project/run_finetune.py": FINETUNE,
    "project/run_capstone.py": CAPSTONE,
    "project/run_tensor_parallel.py": TENSOR_PARALLEL,
    "scripts/run_benchmarks.py": BENCHMARKS,
}


def _is_stub(body: str, problem: str) -> bool:
    code = [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith("#")]
    return len(code) == 1 and re.match(rf"raise\s+NotImplementedError\(\s*[\"']Problem {re.escape(problem)}\b",
                                       code[0]) is not None


def _order(ids) -> list[str]:
    return sorted(ids, key=lambda p: [int(x) if x.isdigit() else x for x in p.split(".")])


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def problems_not_ready(needs: Needs, root: Path = ROOT, stubs_too: bool = True) -> list[str]:
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
    ordered = _order(stubs)
    if ordered and stubs_too:
        verb = "is" if len(ordered) == 1 else "are"
        broken.append(f"Problem{'s' if len(ordered) > 1 else ''} {_join(ordered)} {verb} not implemented yet")
    return broken


def ensure_ready(command: str, needs: Needs, root: Path = ROOT, stubs_too: bool = True) -> None:
    """Raise UniformError (one line) when a problem ``command`` needs is unwritten or does not parse::

        project/run_data_parallel.py needs Problems 1.1 and 1.2: Problem 1.2 is not implemented yet

    ``stubs_too=False`` checks only that the files parse (before importing them).
    """
    problems = problems_not_ready(needs, root, stubs_too)
    if problems:
        ids = _order(needs)
        raise UniformError(f"{command} needs Problem{'s' if len(ids) > 1 else ''} {_join(ids)}: "
                           f"{'; '.join(problems)}")


def problem_ids(needs: Needs) -> str:
    """``needs``' problem ids in order, as text: ``1.1 and 1.2``."""
    return _join(_order(needs))


def parts_not_ready(parts: dict[str, Needs], root: Path = ROOT) -> dict[str, str]:
    """``{part: why}`` for each part of ``parts`` that cannot run yet (its problems unwritten or not parsing).

    ``why`` reads ``needs Problems 2.1, 2.2 and 2.3: Problem 2.2 is not implemented yet``.
    """
    out = {}
    for part, needs in parts.items():
        problems = problems_not_ready(needs, root)
        if problems:
            out[part] = f"needs Problem{'s' if len(needs) > 1 else ''} {problem_ids(needs)}: {'; '.join(problems)}"
    return out


def _merge(*tables: Needs) -> Needs:
    """One table needing everything ``tables`` need (a problem needed whole in one is needed whole)."""
    out: dict[str, tuple[str, ...] | None] = {}
    for table in tables:
        for problem, functions in table.items():
            if functions is None or (problem in out and out[problem] is None):
                out[problem] = None
            else:
                out[problem] = tuple(dict.fromkeys((*(out.get(problem) or ()), *functions)))
    return out


def _problems_handed_out(root: Path) -> set[str]:
    found: set[str] = set()
    for package in STUDENT_PACKAGES:
        for file in (Path(root) / package).rglob("*.py"):
            found |= set(re.findall(r"BEGIN_STUDENT\s+(\S+)\s*$", file.read_text(), re.M))
    return found


def not_handed_out(needs: Needs, root: Path = ROOT) -> list[str]:
    """The problems (``4``, ``5``) of ``needs`` whose regions ``root``'s student files lack: the course did not
    choose them. Empty when all are there."""
    found = _problems_handed_out(root)
    return sorted({p.split(".")[0] for p in needs if p not in found}, key=int)


def ensure_bench_ready(flags: list[str], root: Path = ROOT) -> dict[str, str]:
    """What ``scripts/run_benchmarks.py FLAGS`` may run: UniformError (one line) when it cannot run, else
    ``{part: why}`` for the parts its ``flags`` add (``BENCH_FLAGS``) that it will skip.

    The run needs one of ``BENCH_BASE`` and each part a flag needs; a flag's other parts are measured where
    written and skipped (named) where not, or where the course does not hand their problem out. A flag
    with a needed part the course does not hand out is refused too::

        scripts/run_benchmarks.py --tensor_parallel needs Problems 1.1 and 1.2 (data_parallel) or 2.1, 2.2 and
        2.3 (pipeline), and 5.1 and 5.2 (tensor_parallel): Problems 5.1 and 5.2 are not implemented yet
        scripts/run_benchmarks.py --tensor_parallel measures Problem 5 (tensor_parallel), which this course does
        not hand out
    """
    flags = [flag for flag in BENCH_FLAGS if flag in flags]
    command = " ".join(["scripts/run_benchmarks.py", *flags])
    wanted: dict[str, Needs] = {}
    needed: dict[str, Needs] = {}
    skipped: dict[str, str] = {}
    for flag in flags:
        optional, required = BENCH_FLAGS[flag]
        for part, needs in required.items():
            if absent := not_handed_out(needs, root):
                raise UniformError(f"{command} measures Problem {_join(absent)} ({part}), which this course does "
                                   "not hand out")
            needed[part] = needs
        for part, needs in optional.items():
            if absent := not_handed_out(needs, root):
                skipped[part] = f"this course does not hand out Problem {_join(absent)}"
            else:
                wanted[part] = needs
    base = {part: BENCH_PARTS[part] for part in BENCH_BASE}
    base_runs = len(parts_not_ready(base, root)) < len(base)
    if base_runs and not parts_not_ready(needed, root):
        return skipped | parts_not_ready(wanted, root)
    text = " or ".join(f"{problem_ids(needs)} ({part})" for part, needs in base.items())
    text += "".join(f", and {problem_ids(needs)} ({part})" for part, needs in needed.items())
    if wanted:
        text += "; it measures " + " and ".join(f"{problem_ids(needs)} ({part})" for part, needs in wanted.items())
        text += " too where written"
    merged = _merge(*needed.values()) if base_runs else _merge(*base.values(), *needed.values(), *wanted.values())
    raise UniformError(f"{command} needs Problems {text}: {'; '.join(problems_not_ready(merged, root))}")
