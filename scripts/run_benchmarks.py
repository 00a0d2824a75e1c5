"""Benchmark data-parallel and pipeline training (and, with --peers, the reference implementations).

    python scripts/run_benchmarks.py                     # student mode: figures + summary in submit_figures/
    python scripts/run_benchmarks.py --quick             # small workload, few repeats, same outputs
    python scripts/run_benchmarks.py --peers             # also the reference implementations
    python scripts/run_benchmarks.py --mode grader       # exit 1 when a threshold is missed (on 2 GPUs)

Every variant trains on the same model weights and global batches; runs
alternate between variants. A variant's step_time_ms is the median over
repeats of (run time / steps); a ratio (speedup, speedup_m<M>) is the
quotient of two step_time_ms. The console, performance_summary.json and the
figures show the same numbers under the same names. Each run writes its raw
log, summary and figures to its own folder <workdir>/perf/<time>/ and copies
the summary and figures to submit_figures/; what they replace stays in its
own run's folder, and the run says where. On a machine without 2 GPUs the
thresholds do not apply and are reported as such. A part whose problems are
not written yet is skipped and named; the rest is measured. Exit codes: 0
done, 1 threshold missed (grader mode, 2 GPUs), 2 a part failed or the run
was refused (see the message).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# no torch here: the library is imported where it runs, after the checks (project/__init__.py)
from project.bench.options import Options  # noqa: E402


def _chunks(text: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.split(",") if v.strip())
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma list of positive integers, got {text!r}")
    return values


def _handed_out() -> tuple[bool, bool]:
    """Whether this kit hands out Problem 4 and Problem 5 (their student regions are there)."""
    from project import readiness

    return (not readiness.not_handed_out(readiness.DDP_ZERO), not readiness.not_handed_out(readiness.TENSOR_PARALLEL))


def build_parser() -> argparse.ArgumentParser:
    """The command line of the benchmark; its help names only the problems this kit hands out."""
    four, five = _handed_out()
    peers = "also measure DDP, flat all-reduce, torch GPipe and PEFT next to yours (needs Problem 3.1 for LoRA)"
    if four:
        peers += ", and your BucketedDDP and ShardedOptimizer (Problem 4) next to torch DDP and DeepSpeed"
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["student", "grader"], default="student",
                   help="grader: exit 1 when a threshold is missed on 2 GPUs (default: student)")
    p.add_argument("--quick", action="store_true", help="small workload and few repeats (a smoke run)")
    p.add_argument("--peers", action="store_true", help=peers)
    p.add_argument("--preset", default="tiny", help="model preset of project/model.py: tiny, small, gpt2 "
                                                    "(default: tiny)")
    p.add_argument("--batch_size", type=int, help="global batch (sequences, even); default 32, quick 16")
    p.add_argument("--max_len", type=int, default=64, help="tokens per sequence at most (default: 64)")
    p.add_argument("--steps", type=int, help="timed steps per run; default 4, quick 2")
    p.add_argument("--warmup", type=int, help="untimed warm-up steps per variant; default 2, quick 1")
    p.add_argument("--repeats", type=int, help="alternating repeats; default 5, quick 3")
    p.add_argument("--n_chunks", type=_chunks, help="pipeline micro-batch counts; default 2,4,8, quick 2,4 "
                                                      "(--peers adds --gpipe_chunks)")
    p.add_argument("--gpipe_chunks", type=int, default=4, help="micro-batches of the torch GPipe peer (default: 4)")
    p.add_argument("--dp_threshold", type=float, default=1.4, help="grader: least DP speedup on 2 GPUs "
                                                                   "(default: 1.4)")
    p.add_argument("--pp_threshold", type=float, default=1.1, help="grader: least PP speedup on 2 GPUs "
                                                                   "(default: 1.1)")
    p.add_argument("--threads", type=int, help="torch threads per worker process; default on CPU the runners' "
                                               "policy, usable CPUs // 2 (one worker = one device); torch's own on GPU")
    p.add_argument("--workdir", default="workdir", help="data cache and each run's own folder <workdir>/perf/<time>/ "
                                                        "(default: workdir)")
    p.add_argument("--figures_dir", default="submit_figures", help="where the PNGs and the summary are copied "
                                                                   "(default: submit_figures)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds any one command of a worker may take "
                                                                "(default: 300)")
    p.add_argument("--tensor_parallel", action="store_true", help="then compare tensor vs data vs pipeline "
                   "parallel (Problem 5): parameter memory and step time per rank" if five else argparse.SUPPRESS)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv`` or ``sys.argv[1:]``); argparse exits with code 2 on malformed options."""
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit code (2 with one line when a needed problem is not written yet)."""
    args = parse_args(argv)
    from project import readiness

    try:   # a ConfigError (readiness) is a ValueError too
        flag_skips = readiness.ensure_bench_ready([flag for flag in readiness.BENCH_FLAGS
                                                   if getattr(args, flag.removeprefix("--"))])
        opts = Options(mode=args.mode, quick=args.quick, peers=args.peers, preset=args.preset,
                       batch_size=args.batch_size, max_len=args.max_len, steps=args.steps, warmup=args.warmup,
                       repeats=args.repeats, n_chunks=args.n_chunks, gpipe_chunks=args.gpipe_chunks,
                       dp_threshold=args.dp_threshold, pp_threshold=args.pp_threshold, threads=args.threads,
                       workdir=args.workdir, figures_dir=args.figures_dir, timeout_s=args.timeout,
                       argv=sys.argv[1:] if argv is None else list(argv)).resolved()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from project.bench import report, suite   # torch and the library: only after the checks
    from project.bench.pool import BenchError

    try:
        summary, code = suite.run(opts)
    except (ValueError, BenchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        if "NotImplementedError" in str(exc):
            print("the benchmarks run your code: finish Problems 1 and 2 (and 3 for --peers) first",
                  file=sys.stderr)
        return 2
    print(report.table(summary))
    for part, why in summary.get("skipped", {}).items():
        print(f"not measured: {part} ({why})")
    if "ddp_zero" in flag_skips:   # --peers, and Problem 4 is not written yet (or not handed out: then say nothing)
        if _handed_out()[0]:
            print(f"Problem 4 group not measured: {flag_skips['ddp_zero']}")
    elif args.peers and "data_parallel" in summary.get("skipped", {}):
        print("Problem 4 group not measured: it compares with your average_gradients (Problem 1.2)")
    elif args.peers:   # Problem 4 next to torch DDP and DeepSpeed
        from project.bench import ddp_peers

        print(ddp_peers.extend_summary(summary, opts.resolved(), Path(args.figures_dir)))
    print(f"summary and figures: {args.figures_dir}/ ({', '.join(summary['figures'])}); this run's own copy "
          f"and raw log: {summary['run_folder']}/")
    if args.tensor_parallel:   # Problem 5 is handed out and written (ensure_bench_ready)
        from project.bench import tensor_parallel

        print(tensor_parallel.table(tensor_parallel.run(tensor_parallel.TPOptions(
            preset=args.preset, quick=args.quick, max_len=args.max_len, workdir=args.workdir,
            figures_dir=args.figures_dir))))
    return code


if __name__ == "__main__":
    sys.exit(main())
