"""Where a grading run's time goes, case by case: ``python -m grading grade --profile``.

Read after the run from what the launcher, the workers and the runner left in each case's run folder.
"""
from __future__ import annotations

import json
from pathlib import Path

COLUMNS = ("preload", "start", "imports", "rendezvous", "probe_imp", "probe", "saving", "judging", "wall")


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def case_profile(run_dir: Path) -> dict[str, float] | None:
    """The breakdown of one case's run folder, in seconds; None when it left no timing.

    Read from its ``launch.json``, ``rank<R>/timing.json`` and ``judged.json``. The rank that finished last is
    the one shown (it bounds the case); ``cold_imports`` lists the library packages its ranks imported themselves::

        preload     the fork servers importing the case's ``preload`` before its first spawn (once a run)
        start       spawn -> the worker's ``main`` runs (interpreter start, ``grading`` import)
        imports     sandbox limits + ``import torch``
        rendezvous  the process group (0 when the probe sets up its own)
        probe_imp   importing the probe's module (the grader's checks, and what they import)
        probe       the probe: student code and the grader's recording, result files excluded
        saving      writing and signing result files
        judging     the criteria, in the parent
        wall        the launch, preloads and first spawn to last exit (the parent's clock)
    """
    launch = _read(run_dir / "launch.json")
    ranks = sorted(run_dir.glob("rank*/timing.json"))
    if not launch or not ranks:
        return None
    rows = []
    for path in ranks:
        marks = _read(path)
        rank = int(path.parent.name.removeprefix("rank"))
        spawned = launch["spawned"][rank] if rank < len(launch["spawned"]) else marks.get("main", 0.0)
        if not {"main", "torch", "group", "probe_imported", "probe_done"} <= set(marks):
            continue
        saving = float(marks.get("saving_s", 0.0))
        rows.append({"start": marks["main"] - spawned, "imports": marks["torch"] - marks["main"],
                     "rendezvous": marks["group"] - marks["torch"],
                     "probe_imp": marks["probe_imported"] - marks["group"],
                     "probe": marks["probe_done"] - marks["probe_imported"] - saving, "saving": saving,
                     "end": marks["probe_done"]})
    if not rows:
        return None
    last = max(rows, key=lambda row: row["end"])
    del last["end"]
    cold = sorted({name for path in ranks for name in _read(path).get("cold_imports", {})})
    return {"preload": float(launch.get("preload_s", 0.0)), **last,
            "judging": float(_read(run_dir / "judged.json").get("judge_s", 0.0)),
            "wall": float(launch.get("wall_s", 0.0)), "cold_imports": cold}


def table(runs_dir: Path) -> str:
    """The per-case breakdown of every case folder under ``runs_dir``, with a total row; below it, the library
    packages each case's ranks imported themselves, which its ``preload`` could have the fork servers import once."""
    header = f"{'case':<28}" + "".join(f"{c:>11}" for c in COLUMNS)
    lines = [header, "-" * len(header)]
    total = dict.fromkeys(COLUMNS, 0.0)
    rows = []
    for run_dir in sorted(p for p in Path(runs_dir).iterdir() if p.is_dir()):
        row = case_profile(run_dir)
        if row is None:
            lines.append(f"{run_dir.name:<28}  (no timing: the case did not finish cleanly)")
            continue
        rows.append((run_dir, row))
        for column in COLUMNS:
            total[column] += row[column]
        lines.append(f"{run_dir.name:<28}" + "".join(f"{row[c]:>11.2f}" for c in COLUMNS))
    cold = [f"  {run_dir.name}: {', '.join(row['cold_imports'])}" for run_dir, row in rows if row["cold_imports"]]
    lines += ["-" * len(header), f"{'total':<28}" + "".join(f"{total[c]:>11.2f}" for c in COLUMNS)]
    if cold:
        lines += ["", "imported by the ranks themselves (a case's preload lets the fork servers import them once):",
                  *cold]
    return "\n".join(lines)
