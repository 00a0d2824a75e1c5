"""Figures at grading: what a submission's ``submit_figures/`` claims, and the staff's own benchmark run.

``figures_notes`` describes the handed-in figures for the grade report, never scored; ``python -m grading
benchmarks SUBMISSION`` scores the course thresholds from a run of its own on 2 GPUs (``run_benchmark_check``);
``python -m grading.commands.benchmarks FIGURES_DIR`` prints the warnings of ``scripts/create_submission_zip.sh``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from common import ROOT
from common.handin import FIGURES_DIR, REQUIRED_FIGURES, SUMMARY_NAME

if TYPE_CHECKING:       # imported where used: the zip script's warnings need none of the engine
    from grading.engine.runner import Status

NOT_SCORED = "figures (not scored by the autograder)"
MAX_SUMMARY_BYTES = 5 * 1024 * 1024
BENCH_LIMIT_S = 3600.0
THRESHOLDS = (("dp_speedup", "data-parallel speedup of world size 2 over 1 (course threshold)", "data_parallel"),
              ("pp_speedup", "pipeline parallel faster than model parallel (course threshold)", "pipeline"))


def _clean(value: object, limit: int = 60) -> str:
    """``value`` as short printable text (submission JSON is untrusted)."""
    text = "".join(ch if ch.isprintable() else " " for ch in str(value)).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _number(value: object) -> float | None:
    """A finite number from untrusted JSON, else None (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _get(data: object, *keys: str) -> object:
    """``data[k1][k2]...`` through dicts only; None where any step is missing or not a dict."""
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def read_summary(figures_dir: Path) -> tuple[dict | None, str]:
    """``(summary, problem)``: the parsed summary of ``figures_dir``, or None and why it cannot be used."""
    path = Path(figures_dir) / SUMMARY_NAME
    if not path.is_file() or path.is_symlink():
        return None, f"no {SUMMARY_NAME}"
    if path.stat().st_size > MAX_SUMMARY_BYTES:
        return None, f"{SUMMARY_NAME} is larger than {MAX_SUMMARY_BYTES} bytes (ignored)"
    try:
        data = json.loads(path.read_text(errors="replace"))
    except (ValueError, RecursionError) as exc:
        return None, f"{SUMMARY_NAME} is not valid JSON ({_clean(exc)})"
    if not isinstance(data, dict):
        return None, f"{SUMMARY_NAME} is not a JSON object"
    return data, ""


def _hardware(summary: dict) -> str:
    gpus = _get(summary, "hardware", "gpus")
    if isinstance(gpus, list) and gpus:
        names = sorted({_clean(g, 40) for g in gpus})
        return f"{len(gpus)} GPU(s) ({', '.join(names[:3])})"
    cpu, count = _get(summary, "hardware", "cpu"), _number(_get(summary, "hardware", "cpus_usable"))
    cores = f", {count:g} usable core(s)" if count is not None else ""
    return f"CPU only ({_clean(cpu, 50) if cpu else 'model not recorded'}{cores})"


def claimed_speedups(summary: dict) -> list[str]:
    """The speedups a summary claims, as ``name 1.23x`` strings (data parallel first, then each pipeline m)."""
    out = []
    dp = _number(_get(summary, "data_parallel", "ratios", "speedup", "value"))
    if dp is not None:
        out.append(f"data parallel (world size 2 over 1) {dp:.2f}x")
    ratios = _get(summary, "pipeline", "ratios")
    if isinstance(ratios, dict):
        for key in sorted(k for k in ratios if isinstance(k, str) and k.startswith("speedup_m"))[:8]:
            value = _number(_get(ratios, key, "value"))
            if value is not None:
                out.append(f"pipeline over model parallel with {_clean(key.removeprefix('speedup_m'), 6)} "
                           f"micro-batches {value:.2f}x")
    return out


def figures_notes(submission_root: Path) -> list[str]:
    """Report lines on ``submission_root/submit_figures`` (always at least one, each marked as not scored).

    Says whether the plots and the summary are there, whether the summary
    comes from a full run or ``--quick``, on which hardware, the speedups it
    claims and the threshold verdicts it claims. The summary is untrusted text:
    only its plain numbers and short cleaned strings are quoted. Never raises
    for what the folder holds.
    """
    folder = Path(submission_root) / FIGURES_DIR
    if not folder.is_dir() or folder.is_symlink():
        return [f"{NOT_SCORED}: the submission has no {FIGURES_DIR}/ folder (make it with "
                "`python scripts/run_benchmarks.py`)"]
    try:
        plots = sorted(p.name for p in folder.iterdir() if p.suffix.lower() == ".png" and p.is_file())
    except OSError as exc:
        return [f"{NOT_SCORED}: {FIGURES_DIR}/ cannot be read ({_clean(exc)})"]
    missing = [name for name in REQUIRED_FIGURES if name not in plots]
    notes = [f"{NOT_SCORED}: {FIGURES_DIR}/ holds {len(plots)} plot(s)"
             + (f"; missing {', '.join(missing)}" if missing else "; every required plot is there")]
    summary, problem = read_summary(folder)
    if summary is None:
        return notes + [f"{NOT_SCORED}: {problem}"]
    kind = "a --quick run (a smoke test: small workload, few repeats)" if summary.get("quick") is True \
        else "a full run"
    created = f" on {_clean(summary['created'], 25)}" if isinstance(summary.get("created"), str) else ""
    notes.append(f"{NOT_SCORED}: {SUMMARY_NAME} was made by {kind}{created}, {_clean(summary.get('mode'), 10)} "
                 f"mode, on {_hardware(summary)}")
    speedups = claimed_speedups(summary)
    notes.append(f"{NOT_SCORED}: claimed speedups: " + ("; ".join(speedups) if speedups else "none recorded"))
    thresholds = summary.get("thresholds")
    if isinstance(thresholds, dict):
        verdicts = [f"{key} {_clean(_get(thresholds, key, 'status'), 16)}" for key, _, _ in THRESHOLDS
                    if _get(thresholds, key, "status") is not None]
        applies = "apply" if thresholds.get("applicable") is True else "do not apply"
        notes.append(f"{NOT_SCORED}: the summary says the course thresholds {applies} on that machine"
                     + (f" ({', '.join(verdicts)})" if verdicts else ""))
    errors = summary.get("errors")
    if isinstance(errors, dict) and errors:
        failed = ", ".join(_clean(k, 20) for k in list(errors)[:5])
        notes.append(f"{NOT_SCORED}: parts that failed in that run: {failed}")
    return notes


def zip_warnings(figures_dir: Path) -> list[str]:
    """What ``create_submission_zip.sh`` prints after packaging: a --quick summary, and that figures are not scored."""
    out = []
    summary, _ = read_summary(Path(figures_dir))
    if summary is not None and summary.get("quick") is True:
        out.append(f"warning: {Path(figures_dir) / SUMMARY_NAME} comes from a --quick run (a smoke test: small "
                   "workload, few repeats); run `python scripts/run_benchmarks.py` without --quick for the "
                   "figures you hand in, then package again")
    out.append("note: the autograder does not score the figures; `python -m grading grade submission.zip` lists "
               "them, and the course staff read them (and may re-run the benchmark on a 2-GPU machine)")
    return out


def gpu_count() -> int:
    """CUDA devices visible to this process (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _result(key: str, title: str, points: float, score: float, status: Status, message: str, seconds: float):
    from grading.engine.runner import CriterionResult

    return CriterionResult(f"benchmarks.{key}", "benchmarks", title, points, score, status, message, seconds)


def not_applicable(gpus: int) -> list:
    """The criteria when fewer than 2 GPUs are visible: nothing scored (0/0), the reason in every message."""
    from grading.engine.runner import Status

    message = (f"thresholds do not apply: this machine has {gpus} GPU(s) and the course thresholds are defined "
               "for 2; nothing was run, and the student's performance_summary.json is never used")
    return [_result(key, title, 0.0, 0.0, Status.NOT_APPLICABLE, message, 0.0) for key, title, _ in THRESHOLDS]


def score_thresholds(summary: dict | None, points: float, seconds: float = 0.0, failure: str = "") -> list:
    """The threshold criteria from the summary of the grader's own benchmark run.

    ``summary`` None (the run died, timed out or wrote nothing) fails both
    with ``failure``; a summary saying the thresholds do not apply gives
    0/0 with its reason; otherwise each threshold is worth ``points`` and
    passes when that run measured at least the threshold.
    """
    from grading.engine.runner import Status

    if summary is None:
        return [_result(key, title, points, 0.0, Status.FAILED, f"the benchmark run gave no summary: {failure}",
                        seconds) for key, title, _ in THRESHOLDS]
    thresholds = summary.get("thresholds") if isinstance(summary.get("thresholds"), dict) else {}
    if thresholds.get("applicable") is not True:
        reason = _clean(thresholds.get("reason", "no verdict in the summary"), 200)
        return [_result(key, title, 0.0, 0.0, Status.NOT_APPLICABLE, f"thresholds do not apply: {reason}", seconds)
                for key, title, _ in THRESHOLDS]
    results = []
    errors = summary.get("errors") if isinstance(summary.get("errors"), dict) else {}
    for key, title, section in THRESHOLDS:
        verdict = thresholds.get(key) if isinstance(thresholds.get(key), dict) else {}
        measured, limit = _number(verdict.get("measured")), _number(verdict.get("threshold"))
        ok = verdict.get("status") == "pass" and measured is not None and limit is not None and measured >= limit
        shown = "not measured" if measured is None else f"{measured:.2f}x"
        message = (f"measured on this machine: {shown} (threshold {limit:g}x; "
                   f"{_clean(verdict.get('definition', ''), 120)})" if limit is not None else "no verdict")
        if section in errors:
            last = str(errors[section]).strip().splitlines()[-1:] or [""]
            message += f"; the {section} part failed: {_clean(last[0], 200)}"
        results.append(_result(key, title, points, points if ok else 0.0, Status.PASSED if ok else Status.FAILED,
                               message, seconds))
    return results


def run_benchmark_check(submission: Path, points: float = 1.0, limit_s: float = BENCH_LIMIT_S,
                        gpus: int | None = None, extra_args: tuple[str, ...] = (),
                        kit_root: Path = ROOT) -> list:
    """Score the course thresholds for ``submission`` by re-running the benchmark here; returns the criteria.

    With fewer than 2 GPUs (``gpus`` overrides the count) nothing runs after
    the submission is opened. Else
    the submission's region bodies are spliced into a copy of the kit and
    ``scripts/run_benchmarks.py --mode grader`` runs there (``extra_args``
    appended), in its own session with the environment a rank gets
    (``isolation.rank_environment``: no course secret), killed after
    ``limit_s`` seconds; only that run's summary is read. Raises SubmissionError for a submission that
    cannot be opened.
    """
    from grading.sandbox.isolation import rank_environment
    from grading.kit.intake import open_submission
    from grading.kit.submission import build_grading_copy, scratch_dir

    scratch = scratch_dir()
    try:
        root = open_submission(Path(submission), kit_root, scratch)
        gpus = gpu_count() if gpus is None else gpus
        if gpus < 2:
            return not_applicable(gpus)
        copy = scratch / "graded"
        build_grading_copy(kit_root, root, copy)
        figures = scratch / "grader_figures"
        command = [sys.executable, "scripts/run_benchmarks.py", "--mode", "grader", "--figures_dir", str(figures),
                   "--workdir", str(scratch / "workdir"), *extra_args]
        start = time.monotonic()
        with open(scratch / "benchmark.log", "wb") as log:
            proc = subprocess.Popen(command, cwd=copy, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**rank_environment(dict(os.environ)), "PYTHONPATH": str(copy)})
            try:
                code = proc.wait(timeout=limit_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
        seconds = time.monotonic() - start
        summary, problem = read_summary(figures)
        tail = (scratch / "benchmark.log").read_text(errors="replace").strip().splitlines()[-3:]
        failure = (f"killed after {limit_s:g} s" if code is None else f"exit code {code}") + f"; {problem}; " \
            + " | ".join(_clean(line, 200) for line in tail)
        return score_thresholds(summary, points, seconds, failure)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _cmd_benchmarks(args: argparse.Namespace) -> int:
    from grading.commands import results_json
    from grading.engine.runner import Status
    from grading.kit.intake import SubmissionError

    if args.points < 0 or args.limit <= 0:
        print("error: --points must be >= 0 and --limit > 0", file=sys.stderr)
        return 2
    try:
        results = run_benchmark_check(Path(args.submission), args.points, args.limit)
    except SubmissionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for r in results:
        print(f"{r.status:<15} {r.score:g}/{r.max_score:g}  {r.id}: {r.title}\n    {r.message}")
    if args.json:
        results_json.write_json(Path(args.json), results, ["benchmark thresholds, measured by the grader's own run "
                                                     "(the submission's figures are not used)"])
    return 1 if any(r.status == Status.FAILED for r in results) else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``benchmarks`` command (staff: course thresholds on a 2-GPU grading machine) to the grading CLI."""
    parser = subparsers.add_parser("benchmarks", help="staff, 2 GPUs: re-run the benchmark on a submission and "
                                   "score the course thresholds (without 2 GPUs: says they do not apply)")
    parser.add_argument("submission", help="submission folder or zip")
    parser.add_argument("--json", help="write the criteria as Gradescope results.json here")
    parser.add_argument("--points", type=float, default=1.0, help="points per threshold (default 1)")
    parser.add_argument("--limit", type=float, default=BENCH_LIMIT_S,
                        help=f"wall-clock limit of the benchmark run in seconds (default {BENCH_LIMIT_S:g})")
    parser.set_defaults(func=_cmd_benchmarks)


def main(argv: list[str] | None = None) -> int:
    """``python -m grading.commands.benchmarks FIGURES_DIR``: print ``zip_warnings`` to stderr; always exit 0."""
    folder = (sys.argv[1:] if argv is None else argv)[:1] or [FIGURES_DIR]
    for line in zip_warnings(Path(folder[0])):
        print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
