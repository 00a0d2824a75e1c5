"""LoRA fine-tuning of GPT-2 with DeepSpeed ZeRO-2 (or 3), with your Problem 3 code.

    python project/run_finetune.py                      # 2 ranks, gloo on CPU (NCCL with 2 GPUs)
    python project/run_finetune.py --pretrained gpt2    # real GPT-2 weights (needs the hub)
    python project/run_finetune.py --zero_stage 3 --offload cpu   # ZeRO-3, optimizer state offloaded to CPU

GPT-2's ``Conv1D`` projections become ``nn.Linear`` (``conv1d_to_linear``), your ``apply_lora`` puts rank-r adapters
on the projections named by ``--lora_targets``, and only the adapters train, through a DeepSpeed engine made from
your ``build_config`` and stepped by your ``train_microbatch``; each rank reads its ``partition_dataset`` part.
Afterwards rank 0 saves the adapter (``save_adapter``, plus a PEFT-format copy), loads it into a fresh model
(``load_adapter``) and checks that the validation loss is the same. Reported: the wrapped layers, the trainable
parameters and each rank's optimizer-state bytes against the ZeRO formula 8 * P / N. Writes ``metrics_rank<r>.json``,
``summary.json`` and ``metrics.jsonl`` to ``<workdir>/out/finetune/<run>/``. Start from a full-model checkpoint
with ``--base_state`` (e.g. one written by ``run_data_parallel.py --save_state``).
"""
from __future__ import annotations

import argparse
import logging
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # run as `python project/run_finetune.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# no torch here: the library is imported where it runs, after the checks (project/__init__.py)
from common.startup import DEEPSPEED_IMPORTS, GPT2_IMPORTS
from project import readiness
from project.cli import ConfigError, float_above, int_at_least, read_constant, run_cli
from project.config import RunConfig
from project.options import (add_common_args, add_launch_args, add_training_args, check_training_args, check_world,
                             new_parser, out_dir, run_name)
from project.output import print_header, print_outcome, quiet_libraries, summarize, write_json

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from project.devices import RankEnv

NAME = "finetune"
COMMAND = "project/run_finetune.py"
LORA_SUFFIXES = ("c_attn", "c_proj", "c_fc")   # attention qkv + output, MLP in + out
RANK_IMPORTS = (*GPT2_IMPORTS, *DEEPSPEED_IMPORTS)   # imported once for all ranks (project.launch)
ADAM_STATE_BYTES = 8                           # exp_avg + exp_avg_sq, fp32, per trainable parameter


def build_parser() -> argparse.ArgumentParser:
    """The command line of this entry point (every option range-checked while parsing)."""
    parser = new_parser(COMMAND, __doc__)
    add_launch_args(parser)
    parser.add_argument("--micro_batch", type=int_at_least(1), default=16, help="sequences per rank per micro-batch")
    parser.add_argument("--zero_stage", type=int, choices=read_constant("project.zero_engine", "ZERO_STAGES"),
                        default=2, help="2: optimizer state and gradients sharded; 3: parameters too")
    parser.add_argument("--offload", choices=read_constant("project.zero_engine", "OFFLOADS"), default="none",
                        help="cpu: keep the optimizer state (and its step) in CPU memory")
    parser.add_argument("--lora_rank", type=int_at_least(1), default=8, help="r: the adapters' rank")
    parser.add_argument("--lora_alpha", type=float_above(0.0), default=16.0,
                        help="alpha: the adapters' update is scaled by alpha / r")
    parser.add_argument("--lora_targets", type=lora_targets, default=",".join(LORA_SUFFIXES),
                        help=f"comma list of the projections wrapped in every block, from {', '.join(LORA_SUFFIXES)} "
                             f"(c_proj: the attention's and the MLP's output)")
    parser.add_argument("--base_state", default=None,
                        help="full-model state_dict to start from (torch.save); None: --pretrained or random weights")
    add_common_args(parser, batch_size=None, n_epochs=3, lr=3e-3)
    add_training_args(parser)
    return parser


def lora_targets(text: str) -> tuple[str, ...]:
    """An argparse ``type``: a comma list of distinct names from ``LORA_SUFFIXES`` (the projections to wrap)."""
    names = tuple(name.strip() for name in text.split(","))
    if not all(names) or len(set(names)) != len(names) or not set(names) <= set(LORA_SUFFIXES):
        raise argparse.ArgumentTypeError(f"expected a comma list of distinct names from {', '.join(LORA_SUFFIXES)}, "
                                         f"got {text!r}")
    return names


def resume_meta(args: argparse.Namespace, world_size: int) -> dict:
    """What a checkpoint of this run records and a ``--resume`` must match."""
    return {"entry": NAME, "world_size": world_size, "micro_batch": args.micro_batch, "grad_accum": args.grad_accum,
            "zero_stage": args.zero_stage, "offload": args.offload, "preset": args.preset,
            "lora_rank": args.lora_rank, "lora_targets": list(args.lora_targets), "seed": args.seed}


def check_args(args: argparse.Namespace, world_size: int, n_train: int) -> None:
    """Raise ConfigError for sizes that cannot work."""
    check_world(world_size, n_train)
    if args.base_state and not Path(args.base_state).is_file():
        raise ConfigError(f"--base_state {args.base_state!r} is not a file")


def lora_model(args: argparse.Namespace | RunConfig, tokenizer) -> torch.nn.Module:
    """The base GPT-2 (preset, --pretrained or --base_state) with LoRA adapters; only they are trainable."""
    import torch

    from finetune.gpt2 import conv1d_to_linear, lora_target_names
    from finetune.lora import apply_lora
    from project.model import build_model

    model = build_model(args.preset, tokenizer, args.pretrained, args.seed)
    if args.base_state:
        try:
            state = torch.load(args.base_state, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(f"--base_state {args.base_state}: not a torch.save'd state_dict ({exc})") from None
        try:
            model.load_state_dict(state)
        except (RuntimeError, TypeError, AttributeError) as exc:
            raise ConfigError(f"--base_state {args.base_state} does not fit --preset {args.preset} "
                              f"with this tokenizer: {str(exc).splitlines()[0]}") from None
    conv1d_to_linear(model)
    return apply_lora(model, lora_target_names(model, args.lora_targets), rank=args.lora_rank, alpha=args.lora_alpha)


def wrapped_layers(model: torch.nn.Module) -> dict[str, list[int]]:
    """``{dotted name: [in_features, out_features]}`` of every ``LoRALinear`` in ``model`` (the wrapped layers)."""
    from finetune.lora import LoRALinear

    return {name: [m.in_features, m.out_features] for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def lora_lines(summary: dict) -> list[str]:
    """The report's lines on the adapters: r, alpha, each kind of wrapped layer (in -> out, how many, r x (in + out)
    each) and the trainable parameters they add up to."""
    r, kinds = summary["lora_rank"], {}
    for name, (n_in, n_out) in summary["lora_layers"].items():
        kind = ".".join(name.split(".")[-2:])           # attn.c_attn, mlp.c_fc, ...
        kinds.setdefault((kind, n_in, n_out), []).append(name)
    lines = [f"  LoRA: r = {r}, alpha = {summary['lora_alpha']:g} (scale alpha / r = {summary['lora_alpha'] / r:g}), "
             f"{len(summary['lora_layers'])} wrapped layers:"]
    for (kind, n_in, n_out), names in kinds.items():
        lines.append(f"    {kind:<12} {n_in:>5} -> {n_out:<5} x {len(names)}: r x (in + out) = {r * (n_in + n_out):,} "
                     f"each")
    share = 100 * summary["trainable_parameters"] / summary["parameters"]
    lines.append(f"  trainable parameters {summary['trainable_parameters']:,} of {summary['parameters']:,} "
                 f"({share:.2f}%)")
    return lines


def optimizer_state_bytes(engine) -> tuple[int, int]:
    """``(Adam state bytes, fp32 partition elements)`` this rank's ZeRO optimizer holds."""
    import torch

    inner = engine.optimizer.optimizer if hasattr(engine.optimizer, "optimizer") else engine.optimizer
    state_bytes = sum(t.numel() * t.element_size() for s in inner.state.values() for t in s.values()
                      if torch.is_tensor(t) and t.dim() > 0)
    partition = sum(p.numel() for group in inner.param_groups for p in group["params"])
    return state_bytes, partition


def finetune_rank(env: RankEnv, config: RunConfig, data: tuple) -> None:
    """One rank, top to bottom: group, data, LoRA model, optimizer and DeepSpeed engine, the training loop,
    evaluation, outputs (rank 0 also saves the adapter and checks it reloads)."""
    import torch.distributed as dist

    from data_parallel.dataset import partition_dataset
    from project.devices import join_group
    from project.model import validation_loss

    _quiet_rank_logs()
    join_group(env, config.backend)   # process group: your setup_process_group (Problem 1.2)
    rank, world_size = env.rank, env.world_size
    quiet = config.quiet or rank != 0

    train_set, valid, tokenizer, collate = data                                         # data (main prepared it)
    loader = partition_dataset(rank, world_size, train_set, world_size * config.micro_batch, collate)
    run = _lora_engine(config, tokenizer, world_size, len(loader))                      # model, optimizer, engine

    def val_loss(net: torch.nn.Module) -> float:
        return validation_loss(net, valid, collate, run.device, quiet)

    before, result = _train_adapters(config, env, run, loader, val_loss)                # the loop
    after = val_loss(run.engine.module)                                                 # evaluation
    metrics = _rank_metrics(config, env, run, before, result, after)                    # outputs
    reloaded = _save_and_reload_adapter(config, tokenizer, run, rank, val_loss)
    if reloaded is not None:
        metrics["adapter"] = reloaded
    write_json(config.out_dir / f"metrics_rank{rank}.json", metrics)
    dist.barrier()   # every rank's metrics file is written
    dist.destroy_process_group()


def _quiet_rank_logs() -> None:
    """A rank's output is its progress and report: no library chatter, DeepSpeed's warnings only, and not the
    FutureWarnings of torch's renamed collectives."""
    quiet_libraries()
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*(all_gather_into_tensor|reduce_scatter_tensor).*",
                            category=FutureWarning)


@dataclass
class _LoraEngine:
    """One rank's DeepSpeed engine over the LoRA model, with what the loop and the report need of its making."""

    engine: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    ds_config: dict
    adapters: list                     # the adapters' parameters, as the optimizer holds them
    layers: dict[str, list[int]]       # wrapped_layers
    trainable: int                     # parameters counted before ZeRO-3 partitions them
    parameters: int
    device: torch.device


def _lora_engine(config: RunConfig, tokenizer, world_size: int, batches_per_epoch: int) -> _LoraEngine:
    """The LoRA model (your apply_lora), an AdamW over its adapters with the run's scheduler, and the DeepSpeed
    engine made from your build_config."""
    import torch

    from finetune.lora import adapter_parameters
    from finetune.zero import build_config, init_engine
    from project.loop import make_scheduler
    from project.model import count_parameters, enable_activation_checkpointing
    from project.zero_engine import zero_config

    model = lora_model(config, tokenizer)                                               # model: your apply_lora
    if config.grad_ckpt:
        enable_activation_checkpointing(model)
    trainable, n_params = count_parameters(model, trainable_only=True), count_parameters(model)   # before ZeRO-3
    layers = wrapped_layers(model)
    adapters = list(adapter_parameters(model).values())
    optimizer = torch.optim.AdamW(adapters, lr=config.lr)                               # optimizer, engine
    scheduler = make_scheduler(optimizer, config, batches_per_epoch)
    ds_config = zero_config(build_config(world_size, config.micro_batch, config.grad_accum, config.precision),
                            config.zero_stage, config.offload)                          # your build_config
    engine = init_engine(model, optimizer, ds_config)
    return _LoraEngine(engine, optimizer, scheduler, ds_config, adapters, layers, trainable, n_params,
                       next(engine.module.parameters()).device)


def _train_adapters(config: RunConfig, env: RankEnv, run: _LoraEngine, loader,
                    val_loss: Callable[[torch.nn.Module], float]) -> tuple[float, dict]:
    """``(validation loss before, train's result)``: the shared training loop over the engine, stepped by your
    train_microbatch (DeepSpeed reduces the gradients)."""
    import torch.distributed as dist

    from finetune.zero import train_microbatch
    from project.devices import all_reduce_sum
    from project.loop import REDUCED_BY_ENGINE, LoopParts, prepare_run, train
    from project.model import lm_loss
    from project.zero_engine import DeepSpeedUpdate

    engine = run.engine
    spec, step_log, before = prepare_run(config, env.rank, lambda: val_loss(engine.module))
    update = DeepSpeedUpdate(engine, lambda eng, x, y: train_microbatch(eng, x, y, lm_loss), run.device)
    parts = LoopParts(model=engine.module, optimizer=run.optimizer, scheduler=run.scheduler, loader=loader,
                      device=run.device, update=update, reduce_grads=REDUCED_BY_ENGINE, rank=env.rank,
                      world_size=env.world_size, all_reduce_sum=all_reduce_sum, barrier=dist.barrier,
                      step_log=step_log)
    dist.barrier()
    result = train(parts, spec)
    step_log.close()
    return before, result


def _rank_metrics(config: RunConfig, env: RankEnv, run: _LoraEngine, before: float, result: dict,
                  after: float) -> dict:
    """``metrics_rank<r>.json`` but the adapter check: the run's options, the model and its adapters, the losses
    before and after, the loop's outcome, and this rank's optimizer-state bytes against the ZeRO formula."""
    from project.devices import thread_facts

    state_bytes, partition = optimizer_state_bytes(run.engine)
    return {"rank": env.rank, "world_size": env.world_size, "backend": config.backend, "device": str(run.device),
            "preset": config.preset, "precision": config.precision, "parameters": run.parameters,
            "trainable_parameters": run.trainable, "lora_rank": config.lora_rank, "lora_alpha": config.lora_alpha,
            "lora_layers": run.layers, "zero_stage": config.zero_stage, "offload": config.offload,
            "grad_accum": config.grad_accum, "grad_ckpt": config.grad_ckpt, "deepspeed_config": run.ds_config,
            **thread_facts(), "val_loss_before": before, "epochs": result["epochs"],
            "optimizer_steps": result["steps"], "rollbacks": result["rollbacks"],
            "stopped_early": result["stopped_early"], "val_loss_after": after,
            "zero": {"optimizer_state_bytes": state_bytes, "fp32_partition_elements": partition,
                     "formula_state_bytes": ADAM_STATE_BYTES * run.trainable / env.world_size,
                     "unsharded_state_bytes": ADAM_STATE_BYTES * run.trainable}}


def _save_and_reload_adapter(config: RunConfig, tokenizer, run: _LoraEngine, rank: int,
                             val_loss: Callable[[torch.nn.Module], float]) -> dict | None:
    """Rank 0 saves the adapter (your save_adapter, plus a PEFT-format copy), loads it into a fresh model (your
    load_adapter) and returns its path, size and validation loss there; None on the other ranks, which only
    take part in gathering ZeRO-3's shards of the adapters."""
    from finetune.lora import load_adapter, save_adapter
    from finetune.peft_io import export_peft_adapter
    from project.zero_engine import gathered

    folder, engine = config.out_dir, run.engine
    adapter = folder / "adapter.pt"
    with gathered(engine, run.adapters):   # ZeRO-3 holds a shard of each adapter per rank: gather, on every rank
        if rank == 0:
            save_adapter(engine.module, adapter)
            export_peft_adapter(engine.module, folder / "peft_adapter", base_model_name_or_path=config.pretrained)
    if rank != 0:
        return None
    fresh = lora_model(config, tokenizer).to(run.device)
    load_adapter(fresh, adapter)
    return {"path": str(adapter), "bytes": adapter.stat().st_size, "val_loss_reloaded": val_loss(fresh)}


def summarize_finetune(per_rank: list[dict]) -> dict:
    """``project.output.summarize`` plus the adapter check and the ZeRO bytes of every rank."""
    first = per_rank[0]
    return summarize(per_rank, keep=("parameters", "trainable_parameters", "lora_rank", "lora_alpha", "lora_layers",
                                     "zero_stage", "offload", "grad_accum",
                                     "precision", "grad_ckpt", "torch_threads", "thread_policy", "optimizer_steps",
                                     "rollbacks", "stopped_early")) | {
        "val_loss_reloaded": first["adapter"]["val_loss_reloaded"], "adapter_bytes": first["adapter"]["bytes"],
        "optimizer_state_bytes_per_rank": [m["zero"]["optimizer_state_bytes"] for m in per_rank],
        "formula_state_bytes_per_rank": first["zero"]["formula_state_bytes"],
        "unsharded_state_bytes": first["zero"]["unsharded_state_bytes"]}


def main(argv: list[str] | None = None) -> dict | None:
    """Fine-tune on every rank; return the summary (None on torchrun ranks other than 0).

    Raises ConfigError for bad arguments and unwritten Problem 1/3 code before any rank starts.
    """
    args = build_parser().parse_args(argv)   # a bad option exits with code 2 and one line
    readiness.ensure_ready(COMMAND, readiness.FINETUNE)
    from project.resume import save_errors_in_one_line   # torch and the library: only after the checks
    from project.data import make_collate, prepare_data
    from project.launch import launch_and_summarise, start_rank_server, world_of

    world_size, local_ranks, backend = world_of(args)
    start_rank_server(world_size, RANK_IMPORTS)
    meta = resume_meta(args, world_size)
    resume, checkpoint_meta = check_training_args(args, "cuda" if backend == "nccl" else "cpu", meta)
    quiet_libraries()
    train_set, valid, tokenizer = prepare_data(args.dataset, args.tokenizer, Path(args.workdir), args.n_train,
                                               args.n_valid, args.seed)   # once: every rank receives it
    check_args(args, world_size, len(train_set))
    if args.base_state:
        lora_model(args, tokenizer)   # a checkpoint that does not fit fails here, not inside every rank
    folder = out_dir(args, NAME, run_name(args, build_parser(), {"world_size": f"ws{world_size}"}))
    config = RunConfig.of(args, world_size=world_size, backend=backend, resume=resume, checkpoint_meta=checkpoint_meta,
                          out_dir=folder, meta=meta)
    print_header(f"LoRA + ZeRO-{args.zero_stage} fine-tuning" + (", optimizer offloaded to CPU" if args.offload == "cpu"
                 else "") + f": {world_size} rank(s), backend {backend}, preset {args.preset}, {args.micro_batch} "
                 f"sequences per rank per micro-batch x {args.grad_accum} accumulated, {args.n_epochs} epoch(s)")
    with save_errors_in_one_line():   # a rank's failed checkpoint write: one line, not its traceback
        s = launch_and_summarise(finetune_rank, config, (train_set, valid, tokenizer,
                                                         make_collate(tokenizer, args.max_len)),
                                 summarize_finetune, RANK_IMPORTS)
    if s is None:
        return None
    print(*lora_lines(s), sep="\n")
    print(f"  adapter ({s['adapter_bytes']:,} bytes) reloaded into a fresh model: validation loss "
          f"{s['val_loss_reloaded']:.4f}")
    measured = ", ".join(f"{b:,}" for b in s["optimizer_state_bytes_per_rank"])
    print(f"  optimizer state per rank: {measured} bytes; ZeRO formula 8 * P / N = "
          f"{s['formula_state_bytes_per_rank']:,.0f} (unsharded: {s['unsharded_state_bytes']:,})")
    print_outcome(s, f"{folder} (metrics, summary.json, adapter.pt, peft_adapter/)")
    if not args.base_state and not args.pretrained:
        print("  note: the base model was randomly initialised, so LoRA alone can only lower the loss a little; "
              "start from trained weights with --base_state (run_data_parallel.py --save_state) or --pretrained")
    return s


if __name__ == "__main__":
    sys.exit(run_cli(main))
