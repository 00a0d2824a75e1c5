"""Does a full grade fit Gradescope's container? ``python scripts/measure_footprint.py [--problems 1,2,3]``.

Grades the kit's own reference (or ``--tree``'s) (hidden checks included) with ``python -m
grading grade`` and, while it runs, samples the grade's whole process tree
(the grader, its fork servers, every rank) with ``psutil`` every
``--interval`` seconds. Prints:

- peak PSS: the largest sum, over the processes alive at one sample, of their
  proportional set size (shared pages split between the processes that share
  them), which is what a container's memory limit counts; the peak summed RSS
  and process count at that sample beside it;
- CPU-seconds: user + system time of the grade and every descendant it waited
  for (``os.wait4``'s rusage), what ½ vCPU has to deliver; the time Gradescope
  waits for it is about CPU-seconds / vCPUs;
- the largest processes at the peak, by PSS, so one sees what dominates.

Gradescope's default container: 768 MB of memory, ½ vCPU, a 10-minute
timeout (40 minutes at most). The targets of a default assignment are
<= 768 MB peak PSS and <= 240 CPU-s (½ vCPU then finishes inside 8 minutes).
A short sampling interval can miss a brief peak; the figure is a lower bound.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
MB = 1024 * 1024


def _tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _sample(processes: list[psutil.Process]) -> list[tuple[int, int, str]]:
    """(pss, rss, name) of each process still alive; a process that ends mid-sample is skipped."""
    rows = []
    for process in processes:
        try:
            info = process.memory_full_info()
            rows.append((info.pss, info.rss, " ".join(process.cmdline()[:6])[:100]))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return rows


def measure(problems: str, interval: float, tree: Path = ROOT) -> dict:
    """Grade ``tree``'s own reference on ``problems`` while sampling; the figures described in the module docstring."""
    with tempfile.TemporaryDirectory(prefix="footprint-") as scratch:
        results = Path(scratch) / "results.json"
        started = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "grading", "grade", "--problems", problems, "--quiet",
                                  "--json", str(results)], cwd=tree, stdout=subprocess.DEVNULL)
        root = psutil.Process(child.pid)
        peak: tuple[int, int, list] = (0, 0, [])
        status, usage = None, None
        while status is None:
            rows = _sample(_tree(root))
            pss = sum(r[0] for r in rows)
            if pss > peak[0]:
                peak = (pss, sum(r[1] for r in rows), sorted(rows, reverse=True))
            pid, status_code, rusage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                status, usage = status_code, rusage
                break
            time.sleep(interval)
        wall = time.perf_counter() - started
        data = json.loads(results.read_text()) if results.exists() else {}
    return {"peak_pss_mb": peak[0] / MB, "peak_rss_mb": peak[1] / MB, "processes_at_peak": len(peak[2]),
            "largest": [(p / MB, r / MB, name) for p, r, name in peak[2][:8]],
            "cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall,
            "exit_code": os.waitstatus_to_exitcode(status), "score": data.get("score"),
            "max_score": data.get("max_score")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", default="1,2,3", help="the problems graded (default 1,2,3)")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between samples (default 0.1)")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the kit to grade (default: this one), e.g. an "
                        "earlier commit's `git worktree` to compare with")
    args = parser.parse_args(argv)
    m = measure(args.problems, args.interval, args.tree)
    print(f"grade of the reference, Problems {args.problems}: score {m['score']}/{m['max_score']}, "
          f"exit code {m['exit_code']}")
    print(f"peak PSS {m['peak_pss_mb']:.0f} MB (summed RSS {m['peak_rss_mb']:.0f} MB, "
          f"{m['processes_at_peak']} processes)   target <= 768 MB")
    print(f"CPU {m['cpu_s']:.1f} s (wall {m['wall_s']:.1f} s on this machine)   target <= 240 CPU-s")
    print("largest processes at the peak (PSS MB, RSS MB, command):")
    for pss, rss, name in m["largest"]:
        print(f"  {pss:7.0f} {rss:7.0f}  {name}")
    return 0 if m["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
