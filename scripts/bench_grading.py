"""Grading speed, paired against an earlier commit: ``python scripts/bench_grading.py --baseline f4090f5``.

Checks the baseline commit out into a temporary folder (``git worktree``),
then grades the kit's own reference with ``python -m grading grade`` in the
baseline and in this tree, alternately (baseline, current, baseline,
current, ...), ``--repeats`` times each, on the same machine. Prints every
round's two wall times, the paired ratio current / baseline per round and
their median, and whether both gave the same verdicts (criterion by
criterion where the ids agree, and the total). A ratio, never one absolute
time, is the result: the two runs of a round saw the same machine load.

    python scripts/bench_grading.py --baseline f4090f5 [--repeats 3] [--problems 1,2,3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def grade(tree: Path, problems: str, out: Path) -> tuple[float, dict[str, float], float]:
    """Grade ``tree``'s own reference; (wall seconds, criterion id -> score, total score)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "grading", "grade", "--problems", problems, "--quiet", "--json",
                           str(out)], cwd=tree, capture_output=True, text=True)
    wall = time.perf_counter() - started
    try:
        results = json.loads(out.read_text())
    except (OSError, ValueError):
        raise SystemExit(f"grading in {tree} wrote no results (exit {done.returncode}):\n{done.stderr[-2000:]}")
    scores = {t["name"].split(":")[0]: float(t["score"]) for t in results["tests"]}
    return wall, scores, float(results["score"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="the commit to compare with (e.g. f4090f5)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (one baseline + one current run each)")
    parser.add_argument("--problems", default="1,2,3", help="the problems graded (default 1,2,3)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as scratch:
        base = Path(scratch) / "baseline"
        added = subprocess.run(["git", "worktree", "add", "--detach", str(base), args.baseline], cwd=ROOT,
                               capture_output=True, text=True)
        if added.returncode != 0:
            print(f"error: cannot check out {args.baseline}: {added.stderr.strip()}", file=sys.stderr)
            return 2
        try:
            rows = []
            for round_ in range(1, args.repeats + 1):
                b_wall, b_scores, b_total = grade(base, args.problems, Path(scratch) / "base.json")
                c_wall, c_scores, c_total = grade(ROOT, args.problems, Path(scratch) / "current.json")
                rows.append((b_wall, c_wall))
                print(f"round {round_}: baseline {b_wall:6.1f} s   current {c_wall:6.1f} s   "
                      f"ratio {c_wall / b_wall:.2f}", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
    ratios = [c / b for b, c in rows]
    shared = sorted(set(b_scores) & set(c_scores))
    differ = [cid for cid in shared if b_scores[cid] != c_scores[cid]]
    print(f"\nmedian paired ratio current / baseline: {statistics.median(ratios):.2f} "
          f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})")
    print(f"verdicts: total {b_total:g} (baseline) vs {c_total:g} (current); {len(shared)} criteria in both, "
          f"{len(differ)} differ{': ' + ', '.join(differ) if differ else ''}")
    only_base, only_current = sorted(set(b_scores) - set(c_scores)), sorted(set(c_scores) - set(b_scores))
    if only_base or only_current:
        print(f"ids only in the baseline: {only_base}\nids only in the current tree: {only_current}")
    return 0 if not differ and b_total == c_total else 1


if __name__ == "__main__":
    sys.exit(main())
