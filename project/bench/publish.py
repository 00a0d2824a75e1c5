"""A benchmark run's results are kept in its own folder; the figures folder gets a copy, and nothing is lost.

Every run writes its summary and figures to its own folder first
(``<workdir>/perf/<time>/``, beside its raw log), then ``publish`` copies
them to the figures folder (``submit_figures/``) that the submission zip
packages. What that folder held before is another run's results: they stay
in that run's own folder (its summary names it, ``run_folder``), or, when
that folder is gone, are copied to ``<workdir>/perf/replaced-<time>/``
first. ``publish`` returns the lines that say where everything is.
"""
from __future__ import annotations

import datetime
import json
import shutil
from pathlib import Path


def new_run_folder(perf: Path, prefix: str = "") -> Path:
    """A new, empty folder ``perf/<prefix><time>`` (``-2``, ``-3`` ... appended when that name is taken)."""
    stamp = prefix + datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for k in range(1, 1000):
        folder = Path(perf) / (stamp if k == 1 else f"{stamp}-{k}")
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            continue
    raise FileExistsError(f"{perf}: no free run folder name for {stamp}")


def _earlier(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _home(earlier: dict) -> Path | None:
    """The folder the earlier run kept its own copy in, if it still holds that run's summary."""
    named = earlier.get("run_folder") or (Path(earlier["raw_log"]).parent if isinstance(earlier.get("raw_log"), str)
                                          else None)
    return Path(named) if named and Path(named).is_dir() else None


def publish(run_folder: Path, out: Path, summary_name: str, figures: list[str], owned: tuple[str, ...]) -> list[str]:
    """Copy ``run_folder``'s ``summary_name`` and ``figures`` into ``out``; return the lines to print.

    ``owned`` are every file name this kind of run may write to ``out``: those
    of them there from an earlier run are kept first (in that run's folder, or
    copied to ``replaced-<time>/`` beside ``run_folder``), and those this run
    did not draw are removed from ``out`` (no stale figure stays next to a new
    summary).
    """
    run_folder, out = Path(run_folder), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    there = [out / name for name in (summary_name, *owned) if (out / name).is_file()]
    if there:
        earlier = _earlier(out / summary_name)
        home = _home(earlier)
        if home is None:
            home = new_run_folder(run_folder.parent, "replaced-")
        for path in there:
            if not (home / path.name).exists():
                shutil.copy2(path, home / path.name)
        what = " ".join(["run_benchmarks.py", *earlier.get("command", [])]) if earlier else "an earlier run"
        when = f" of {earlier['created']}" if earlier.get("created") else ""
        lines.append(f"{out}/ held the results of `{what}`{when}: they are kept in {home}/")
    for name in owned:
        if name not in figures:
            (out / name).unlink(missing_ok=True)
    for name in (summary_name, *figures):
        shutil.copy2(run_folder / name, out / name)
    lines.append(f"this run's summary and figures: {run_folder}/ (copied to {out}/: "
                 f"{', '.join([summary_name, *figures])})")
    return lines
