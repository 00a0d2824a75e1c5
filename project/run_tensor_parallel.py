"""Tensor-parallel GPT-2 training with your Problem 5 code (every block split across the ranks).

    python project/run_tensor_parallel.py --world_size 2            # starts 2 ranks itself
    python project/run_tensor_parallel.py --world_size 1            # the baseline: the unsplit model
    torchrun --nproc_per_node 2 project/run_tensor_parallel.py     # or let torchrun start them

Every rank builds the same model, splits each block with your ``parallelize_block`` (Megatron-style: attention by
heads, MLP by columns then rows) and trains on the SAME batches: the ranks share the work of each layer, not the
data, and the all-reduces inside the layers give every rank the gradients of what it holds. Per rank it writes
``metrics_rank<r>.json`` (per epoch: time, real tokens per second, train loss; validation loss before and after;
the parameter bytes the rank holds), rank 0 ``metrics.jsonl`` and the launching process ``summary.json``, to
``<workdir>/out/tensor_parallel/<run>/``. With more than one rank it then compares the validation loss with the
unsplit 1-rank baseline's (``--baseline_dir``, read when that run had the same options, else run there first) and
exits with code 1 when it does not match (``--no_baseline`` skips the comparison).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if __package__ in (None, ""):  # run as `python project/run_tensor_parallel.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# no torch here: the library is imported where it runs, after the checks (project/__init__.py)
from common.startup import GPT2_IMPORTS
from project import readiness
from project.cli import ConfigError, run_cli, torchrun_rank
from project.config import RunConfig
from project.options import NOT_IN_RUN_NAME, add_common_args, add_launch_args, new_parser, out_dir, run_name
from project.output import StepLog, print_epochs, print_header, quiet_libraries, summarize, write_json

if TYPE_CHECKING:
    import torch

    from project.devices import RankEnv

NAME = "tensor_parallel"
COMMAND = "project/run_tensor_parallel.py"
# A 2-rank run and the 1-rank run of the same options (fp32, no dropout) end within this of each other:
# the split only changes the order of floating-point sums.
VAL_LOSS_TOLERANCE = 1e-3
# options that do not change the numbers: a baseline run with other values of these still compares
NOT_COMPARED = NOT_IN_RUN_NAME | {"world_size"}


def build_parser() -> argparse.ArgumentParser:
    """The command line of this entry point (every option range-checked while parsing)."""
    parser = new_parser(COMMAND, __doc__)
    add_launch_args(parser, 2, "ranks each block is split over (under torchrun: its own)")
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw", help="the optimizer of every rank")
    parser.add_argument("--baseline_dir", default=None,
                        help="the unsplit 1-rank run to compare with, read when it had the same options, else run "
                             "there; None: <workdir>/out/tensor_parallel/ws1[-the same options]")
    parser.add_argument("--no_baseline", action="store_true", help="do not compare with the unsplit run")
    add_common_args(parser, batch_size=16, n_epochs=1, lr=1e-3)
    return parser


def split_sizes(config) -> dict[str, int]:
    """The sizes tensor parallelism splits, from a ``GPT2Config`` (or a dict of its fields)."""
    get = config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default)
    inner = get("n_inner") or 4 * get("n_embd")
    return {"attention heads (n_head)": get("n_head"), "hidden size (n_embd)": get("n_embd"),
            "MLP inner size (n_inner)": inner}


def check_split(config, world_size: int) -> None:
    """Raise ConfigError naming every size of ``config`` that does not split over ``world_size`` ranks."""
    bad = [f"{name} {size}" for name, size in split_sizes(config).items() if size % world_size]
    if bad:
        raise ConfigError(f"tensor parallelism over {world_size} ranks needs sizes divisible by {world_size}; "
                          f"this model has {', '.join(bad)}: choose another --world_size or --preset")


def parameter_bytes(model: torch.nn.Module) -> dict[str, int]:
    """Bytes of the parameters this rank holds: all of them, and the 2-D ones inside the blocks."""
    named = list(model.named_parameters())
    return {"all": sum(p.numel() * p.element_size() for _, p in named),
            "block_matrices": sum(p.numel() * p.element_size() for n, p in named if ".h." in n and p.dim() == 2)}


def train_rank(env: RankEnv, config: RunConfig, data: tuple) -> None:
    """One rank, top to bottom: group, data, model split by your ``parallelize_block``, optimizer, the training
    loop, evaluation, outputs."""
    import torch
    import torch.distributed as dist

    from project.devices import THREAD_POLICY, join_group
    from project.loop import SINGLE_REPLICA, LoopParts, LoopSpec, train
    from project.model import build_model, lm_loss, validation_loss

    quiet_libraries()
    _, device = join_group(env, config.backend, student_setup=False)   # process group (no Problem 1 code)
    rank, world_size = env.rank, env.world_size
    quiet = config.quiet or rank != 0

    train_set, valid, tokenizer, collate = data                                         # data (main prepared it)
    # every rank reads the same batches in the same order (same seed): the ranks split the layers, not the data
    loader = torch.utils.data.DataLoader(train_set, batch_size=config.batch_size, shuffle=True, collate_fn=collate,
                                         generator=torch.Generator().manual_seed(config.seed))
    model = build_model(config.preset, tokenizer, config.pretrained, config.seed)       # model
    unsplit = parameter_bytes(model)
    if world_size > 1:
        from tensor_parallel.gpt2 import parallelize_gpt2   # your parallelize_block on every block (Problem 5)

        parallelize_gpt2(model)
    model = model.to(device)
    if config.optimizer == "sgd":                                                       # optimizer
        optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    before = validation_loss(model, valid, collate, device, quiet)
    step_log = StepLog(config.out_dir, enabled=rank == 0)                              # the training loop
    # The loop's data-parallel world is 1: every rank sees the same batch and computes the same loss, and
    # the layers' own all-reduces give each rank the gradients of the part it holds (one copy of the model).
    parts = LoopParts(model=model, optimizer=optimizer, scheduler=None,
                      loader=loader, device=device, reduce_grads=SINGLE_REPLICA, rank=rank, barrier=dist.barrier,
                      step_log=step_log,
                      loss_of=lambda batch, epoch, index: lm_loss(model(batch["input_ids"].to(device)),
                                                                  batch["labels"]))
    dist.barrier()
    result = train(parts, LoopSpec(n_epochs=config.n_epochs, quiet=config.quiet))
    step_log.close()
    after = validation_loss(model, valid, collate, device, quiet)                      # evaluation

    folder = config.out_dir                                                             # outputs
    write_json(folder / f"metrics_rank{rank}.json", {
        "rank": rank, "world_size": world_size, "backend": config.backend, "device": str(device),
        "preset": config.preset, "optimizer": config.optimizer, "global_batch_size": config.batch_size,
        "torch_threads": torch.get_num_threads(), "thread_policy": THREAD_POLICY,
        "parameter_bytes": parameter_bytes(model), "unsplit_parameter_bytes": unsplit, "val_loss_before": before,
        "epochs": result["epochs"], "optimizer_steps": result["steps"], "val_loss_after": after})
    dist.barrier()   # every rank's metrics file is written
    dist.destroy_process_group()


def summarize_tensor_parallel(per_rank: list[dict], config: RunConfig) -> dict:
    """``project.output.summarize`` of rank 0 (the ranks train on the same tokens together: counted once), with
    every rank's parameter bytes and the run's options (``run_options``)."""
    summary = summarize(per_rank[:1], keep=("optimizer", "torch_threads", "thread_policy", "optimizer_steps",
                                            "unsplit_parameter_bytes"))
    return summary | {"world_size": len(per_rank), "parameter_bytes_per_rank": [m["parameter_bytes"] for m in per_rank],
                      "run_options": run_options(config)}


def main(argv: list[str] | None = None) -> dict | None:
    """Train on every rank; return the run summary (None on ranks other than torchrun's rank 0).

    Raises ConfigError for bad arguments (sizes that do not split over the
    world size, unwritten Problem 5 code) before any rank starts.
    """
    args = build_parser().parse_args(argv)
    started = torchrun_rank()
    world_size = started[1] if started else args.world_size
    if world_size > 1:   # one rank is the unsplit baseline: no Problem 5 code
        readiness.ensure_ready(COMMAND, readiness.TENSOR_PARALLEL)
    from project.data import make_collate, prepare_data   # torch and the library: only after the checks
    from project.launch import launch_and_summarise, start_rank_server, world_of
    from project.model import PRESETS, build_model

    if world_size > 1:
        if not args.pretrained and args.preset in PRESETS:
            check_split(PRESETS[args.preset], world_size)
    backend = world_of(args)[2]   # resolves --backend: nccl without a GPU per rank is refused here
    start_rank_server(world_size, GPT2_IMPORTS)
    quiet_libraries()
    train_set, valid, tokenizer = prepare_data(args.dataset, args.tokenizer, Path(args.workdir), args.n_train,
                                               args.n_valid, args.seed)   # once: every rank receives it
    if world_size > 1 and (args.pretrained or args.preset not in PRESETS):
        check_split(build_model(args.preset, tokenizer, args.pretrained, args.seed).config, world_size)
    names = {n: run_name(args, build_parser(), {"world_size": f"ws{n}"}) for n in (1, world_size)}   # run folders
    baseline_dir = Path(args.baseline_dir or Path(args.workdir) / "out" / NAME / names[1])
    folder = out_dir(args, NAME, names[world_size])
    config = RunConfig.of(args, world_size=world_size, backend=backend, out_dir=folder)
    data = (train_set, valid, tokenizer, make_collate(tokenizer, args.max_len))
    print_header(f"tensor parallel: {world_size} rank(s), backend {backend}, preset {args.preset}, "
                 f"{args.batch_size} sequences per batch (the same on every rank), {args.n_epochs} epoch(s)")
    summary = launch_and_summarise(train_rank, config, data, lambda ranks: summarize_tensor_parallel(ranks, config),
                                   GPT2_IMPORTS)
    if summary is None:
        return None
    held, unsplit = summary["parameter_bytes_per_rank"][0], summary["unsplit_parameter_bytes"]
    print_epochs(summary)
    print(f"  {summary['optimizer_steps']} optimizer step(s)")
    print(f"  validation loss {summary['val_loss_before']:.4f} -> {summary['val_loss_after']:.4f}")
    print(f"  parameters on rank 0: {held['all'] / 2**20:.2f} MiB of {unsplit['all'] / 2**20:.2f} MiB unsplit "
          f"(block matrices {held['block_matrices'] / 2**20:.2f} of {unsplit['block_matrices'] / 2**20:.2f} MiB)")
    print(f"  wrote: {folder}")
    if world_size > 1 and not args.no_baseline:
        summary["baseline"] = compare_with_baseline(config, data, summary, baseline_dir)
        print(baseline_line(summary["baseline"]))
    return summary


def run_options(config: RunConfig) -> dict:
    """The options that decide the numbers of a run (JSON values), to tell whether a baseline is comparable."""
    return json.loads(json.dumps({k: v for k, v in config.options if k not in NOT_COMPARED}, default=str))


def compare_with_baseline(config: RunConfig, data: tuple, summary: dict, folder: Path) -> dict:
    """Read (same options) or run the unsplit 1-rank baseline in ``folder``; the verdict on the validation loss
    after training.

    Returns ``{"dir", "source": "read"|"ran"|"missing", "val_loss_after",
    "difference", "tolerance", "matches"}`` (``matches`` None when missing:
    under torchrun a baseline is only read).
    """
    from project.launch import launch_and_summarise, torchrun_env

    path, base, source = folder / "summary.json", None, "read"
    if path.is_file():
        try:
            base = json.loads(path.read_text())
        except ValueError:
            base = None
        if not isinstance(base, dict) or base.get("run_options") != run_options(config) \
                or base.get("world_size") != 1:
            base = None
    if base is None and torchrun_env() is None:
        source = "ran"
        print(f"running the unsplit baseline (1 rank, the same options) in {folder} ...", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        alone = replace(config, world_size=1, out_dir=folder)
        base = launch_and_summarise(train_rank, alone, data, lambda ranks: summarize_tensor_parallel(ranks, alone))
    out = {"dir": str(folder), "source": source if base else "missing", "tolerance": VAL_LOSS_TOLERANCE,
           "val_loss_after": None, "difference": None, "matches": None}
    if base:
        difference = abs(summary["val_loss_after"] - base["val_loss_after"])
        out |= {"val_loss_after": base["val_loss_after"], "difference": difference,
                "matches": difference <= VAL_LOSS_TOLERANCE}
    return out


def baseline_line(verdict: dict) -> str:
    """The line that says whether the split run matches the unsplit baseline."""
    if verdict["matches"] is None:
        return (f"  unsplit baseline: none with these options in {verdict['dir']} (under torchrun it is only read: "
                f"run `python {COMMAND} --world_size 1` with the same options first)")
    how = "read from" if verdict["source"] == "read" else "run in"
    word = "MATCH" if verdict["matches"] else "MISMATCH"
    relation = "<=" if verdict["matches"] else ">"
    line = (f"  unsplit baseline ({how} {verdict['dir']}): validation loss {verdict['val_loss_after']:.6f}, "
            f"difference {verdict['difference']:.2e} {relation} tolerance {verdict['tolerance']:.0e}: {word}")
    if not verdict["matches"]:
        line += " (the split model should compute what the unsplit one does: check Problems 5.1 and 5.2)"
    return line


def cli(argv: list[str] | None = None) -> int:
    """The command: ``run_cli(main)``; exit code 1 when the validation loss misses the unsplit baseline's."""
    outcome: dict = {}
    code = run_cli(lambda a: outcome.update(summary=main(a)), argv)
    verdict = (outcome.get("summary") or {}).get("baseline") or {}
    return 1 if code == 0 and verdict.get("matches") is False else code


if __name__ == "__main__":
    sys.exit(cli())
