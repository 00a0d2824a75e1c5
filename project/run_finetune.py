"""LoRA fine-tuning of GPT-2 with DeepSpeed ZeRO-2, with your Problem 3 code.

    python project/run_finetune.py                      # 2 ranks, gloo on CPU (NCCL with 2 GPUs)
    python project/run_finetune.py --pretrained gpt2    # real GPT-2 weights (needs the hub)

GPT-2's ``Conv1D`` projections become ``nn.Linear`` (``conv1d_to_linear``),
your ``apply_lora`` puts adapters on the attention (``c_attn``, ``c_proj``)
and MLP (``c_fc``, ``c_proj``) projections, and only the adapters train,
through a DeepSpeed engine made from your ``build_config`` and stepped by
your ``train_microbatch``; each rank reads its ``partition_dataset`` part.
Afterwards rank 0 saves the adapter (``save_adapter``, plus a PEFT-format
copy), loads it into a fresh model (``load_adapter``) and checks that the
validation loss is the same. Reported: trainable parameters, and each
rank's optimizer-state bytes against the ZeRO-2 formula (Adam keeps two fp32
states per trainable parameter, split over the ranks: 8 * P / N bytes).
Writes ``metrics_rank<r>.json`` and ``summary.json`` to
``<workdir>/out/finetune/``. Start from a full-model checkpoint with
``--base_state`` (e.g. one written by ``run_data_parallel.py --save_state``).
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path

if __package__ in (None, ""):  # run as `python project/run_finetune.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from project.data import ConfigError, make_collate, prepare_data
from project.model import build_model, count_parameters
from project.train_lib import (add_common_args, check_common_args, cpu_threads_per_rank, evaluate,
                               launch_and_summarise, lm_loss, log, out_dir, print_epochs, progress, quiet_libraries,
                               resolve_backend, run_cli, torchrun_env, write_json)

NAME = "finetune"
LORA_SUFFIXES = ("c_attn", "c_proj", "c_fc")   # attention qkv + output, MLP in + out
ADAM_STATE_BYTES = 8                           # exp_avg + exp_avg_sq, fp32, per trainable parameter


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv`` or ``sys.argv[1:]``); argparse exits with code 2 on malformed options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world_size", type=int, default=2, help="ranks to start (under torchrun: its own)")
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    parser.add_argument("--micro_batch", type=int, default=16, help="sequences per rank per micro-batch")
    parser.add_argument("--grad_accum", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32")
    parser.add_argument("--lora_rank", type=int, default=8)
    parser.add_argument("--lora_alpha", type=float, default=16.0)
    parser.add_argument("--base_state", default=None, help="full-model state_dict to start from (torch.save)")
    add_common_args(parser, batch_size=None, n_epochs=3, lr=3e-3)
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace, world_size: int, n_train: int) -> None:
    """Raise ConfigError for sizes that cannot work."""
    for name in ("micro_batch", "grad_accum", "lora_rank"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be at least 1, got {getattr(args, name)}")
    if world_size < 1:
        raise ConfigError(f"--world_size must be at least 1, got {world_size}")
    if world_size > n_train:
        raise ConfigError(f"world size {world_size} is larger than the training data ({n_train} pairs): "
                          f"some ranks would get nothing")
    if args.base_state and not Path(args.base_state).is_file():
        raise ConfigError(f"--base_state {args.base_state!r} is not a file")


def lora_model(args: argparse.Namespace, tokenizer) -> torch.nn.Module:
    """The base GPT-2 (preset, --pretrained or --base_state) with LoRA adapters; only they are trainable."""
    from finetune.gpt2 import conv1d_to_linear, lora_target_names
    from finetune.lora import apply_lora

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
    return apply_lora(model, lora_target_names(model, LORA_SUFFIXES), rank=args.lora_rank, alpha=args.lora_alpha)


def optimizer_state_bytes(engine) -> tuple[int, int]:
    """``(Adam state bytes, fp32 partition elements)`` this rank's ZeRO optimizer holds."""
    inner = engine.optimizer.optimizer if hasattr(engine.optimizer, "optimizer") else engine.optimizer
    state_bytes = sum(t.numel() * t.element_size() for s in inner.state.values() for t in s.values()
                      if torch.is_tensor(t) and t.dim() > 0)
    partition = sum(p.numel() for group in inner.param_groups for p in group["params"])
    return state_bytes, partition


def finetune_rank(rank: int, world_size: int, local_rank: int, local_ranks: int, init_method: str,
                  args: argparse.Namespace) -> None:
    """One rank: group, data, LoRA model, DeepSpeed engine, training, metrics; rank 0 checks the adapter."""
    from data_parallel.comm import setup_process_group
    from data_parallel.dataset import partition_dataset
    from finetune.lora import adapter_parameters, load_adapter, save_adapter
    from finetune.peft_io import export_peft_adapter
    from finetune.zero import build_config, init_engine, train_microbatch
    import torch.distributed as dist

    quiet_libraries()
    backend = resolve_backend(args.backend, local_ranks)
    if backend == "gloo":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")   # gloo means CPU tensors; also spares a warning
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
    if backend == "gloo":
        torch.set_num_threads(cpu_threads_per_rank(local_ranks))
    setup_process_group(rank, world_size, backend, init_method=init_method, timeout=datetime.timedelta(minutes=10))
    quiet = args.quiet or rank != 0

    train, valid, tokenizer = prepare_data(args.dataset, args.tokenizer, Path(args.workdir), args.n_train,
                                           args.n_valid, args.seed)
    collate = make_collate(tokenizer, args.max_len)
    model = lora_model(args, tokenizer)
    trainable = count_parameters(model, trainable_only=True)
    optimizer = torch.optim.AdamW(list(adapter_parameters(model).values()), lr=args.lr)
    config = build_config(world_size, args.micro_batch, args.grad_accum, args.precision)
    engine = init_engine(model, optimizer, config)
    device = next(engine.module.parameters()).device
    loader = partition_dataset(rank, world_size, train, world_size * args.micro_batch, collate)

    def validation_loss(net: torch.nn.Module) -> float:
        net.eval()
        loss = evaluate(net, valid, collate, 64, next(net.parameters()).device, quiet)
        net.train()
        return loss

    metrics = {"rank": rank, "world_size": world_size, "backend": backend, "device": str(device),
               "preset": args.preset, "precision": args.precision, "parameters": count_parameters(model),
               "trainable_parameters": trainable, "deepspeed_config": config,
               "val_loss_before": validation_loss(engine.module), "epochs": []}
    for epoch in range(args.n_epochs):
        dist.barrier()
        start, tokens, losses = time.perf_counter(), 0, []
        for batch in progress(loader, quiet, desc=f"epoch {epoch}", unit="micro-batch"):
            inputs, labels = batch["input_ids"].to(device), batch["labels"].to(device)
            losses.append(train_microbatch(engine, inputs, labels, lm_loss))
            tokens += int(batch["attention_mask"].sum())   # real tokens, no padding
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        metrics["epochs"].append({"epoch": epoch, "train_time_s": seconds, "tokens": tokens,
                                  "tokens_per_s": tokens / seconds, "micro_batches": len(losses),
                                  "optimizer_steps": engine.global_steps,
                                  "train_loss": sum(losses) / max(len(losses), 1)})
        log(f"rank {rank} epoch {epoch}: train loss {metrics['epochs'][-1]['train_loss']:.4f}, "
            f"{tokens / seconds:,.0f} tokens/s, {seconds:.1f} s", args.quiet)
    metrics["val_loss_after"] = validation_loss(engine.module)
    state_bytes, partition = optimizer_state_bytes(engine)
    metrics["zero"] = {"optimizer_state_bytes": state_bytes, "fp32_partition_elements": partition,
                       "formula_state_bytes": ADAM_STATE_BYTES * trainable / world_size,
                       "unsharded_state_bytes": ADAM_STATE_BYTES * trainable}

    folder = out_dir(args, NAME)
    if rank == 0:   # save the adapter, load it into a fresh model, compare validation losses
        adapter = folder / "adapter.pt"
        save_adapter(engine.module, adapter)
        export_peft_adapter(engine.module, folder / "peft_adapter", base_model_name_or_path=args.pretrained)
        fresh = lora_model(args, tokenizer).to(device)
        load_adapter(fresh, adapter)
        metrics["adapter"] = {"path": str(adapter), "bytes": adapter.stat().st_size,
                              "val_loss_reloaded": validation_loss(fresh)}
    write_json(folder / f"metrics_rank{rank}.json", metrics)
    dist.barrier()
    if rank == 0:
        per_rank = [json.loads((folder / f"metrics_rank{r}.json").read_text()) for r in range(world_size)]
        write_json(folder / "summary.json", summarize(per_rank))
    dist.barrier()
    dist.destroy_process_group()


def summarize(per_rank: list[dict]) -> dict:
    """Run-level numbers: per epoch all ranks' tokens over the slowest rank's time; ZeRO bytes per rank."""
    first = per_rank[0]
    epochs = []
    for e in range(len(first["epochs"])):
        rows = [m["epochs"][e] for m in per_rank]
        seconds = max(r["train_time_s"] for r in rows)
        tokens = sum(r["tokens"] for r in rows)
        epochs.append({"epoch": e, "train_time_s": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
                       "train_loss": sum(r["train_loss"] for r in rows) / len(rows)})
    return {"world_size": first["world_size"], "backend": first["backend"], "preset": first["preset"],
            "parameters": first["parameters"], "trainable_parameters": first["trainable_parameters"],
            "epochs": epochs, "val_loss_before": first["val_loss_before"], "val_loss_after": first["val_loss_after"],
            "val_loss_reloaded": first["adapter"]["val_loss_reloaded"], "adapter_bytes": first["adapter"]["bytes"],
            "optimizer_state_bytes_per_rank": [m["zero"]["optimizer_state_bytes"] for m in per_rank],
            "formula_state_bytes_per_rank": first["zero"]["formula_state_bytes"],
            "unsharded_state_bytes": first["zero"]["unsharded_state_bytes"]}


def main(argv: list[str] | None = None) -> dict | None:
    """Fine-tune on every rank; return the summary (None on torchrun ranks other than 0).

    Raises ConfigError for bad arguments before any rank starts.
    """
    args = parse_args(argv)
    env = torchrun_env()
    world_size, local_ranks = (env[1], env[3]) if env else (args.world_size, args.world_size)
    check_common_args(args)
    resolve_backend(args.backend, local_ranks)
    quiet_libraries()
    train, _, tokenizer = prepare_data(args.dataset, args.tokenizer, Path(args.workdir), args.n_train,
                                       args.n_valid, args.seed)
    check_args(args, world_size, len(train))
    if args.base_state:
        lora_model(args, tokenizer)   # a checkpoint that does not fit fails here, not inside every rank
    folder = out_dir(args, NAME)
    s = launch_and_summarise(finetune_rank, world_size, args, folder)
    if s is None:
        return None
    print(f"LoRA + ZeRO-2 fine-tuning: {s['world_size']} rank(s), backend {s['backend']}, preset {s['preset']}")
    print(f"  trainable parameters {s['trainable_parameters']:,} of {s['parameters']:,} "
          f"({100 * s['trainable_parameters'] / s['parameters']:.2f}%)")
    print_epochs(s)
    print(f"  validation loss {s['val_loss_before']:.4f} -> {s['val_loss_after']:.4f}; "
          f"adapter ({s['adapter_bytes']:,} bytes) reloaded into a fresh model: {s['val_loss_reloaded']:.4f}")
    measured = ", ".join(f"{b:,}" for b in s["optimizer_state_bytes_per_rank"])
    print(f"  optimizer state per rank: {measured} bytes; ZeRO-2 formula 8 * P / N = "
          f"{s['formula_state_bytes_per_rank']:,.0f} (unsharded: {s['unsharded_state_bytes']:,})")
    print(f"  metrics and adapter: {folder}")
    if not args.base_state and not args.pretrained:
        print("  note: the base model was randomly initialised, so LoRA alone can only lower the loss a little; "
              "start from trained weights with --base_state (run_data_parallel.py --save_state) or --pretrained")
    return s


if __name__ == "__main__":
    sys.exit(run_cli(main))
