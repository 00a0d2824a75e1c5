"""The one fixed workload every benchmark run trains on.

The parent builds it once and saves it (``build_workload``); every worker process loads the same file, so all
variants start from the same GPT-2 weights and see the same global batches, and world size 1 and 2 do exactly the
same arithmetic on exactly the same real tokens.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class WorkloadSpec:
    """What to train on: model preset, global batch (sequences), sequence cap, steps per run, seed."""

    preset: str = "tiny"
    batch_size: int = 32
    max_len: int = 64
    steps: int = 4
    seed: int = 0
    dataset: str = "embedded"
    workdir: str = "workdir"
    student_split: bool = True   # False (Problem 1.1 unwritten): consecutive rows, no partition_dataset


def build_workload(spec: WorkloadSpec, path: Path) -> dict:
    """Write the workload file to ``path`` and return its description (JSON-ready).

    Raises ValueError for an odd ``batch_size`` (it is split over two ranks)
    or when the data has fewer than ``steps * batch_size`` training pairs.
    Global batch s is rank 0's part + rank 1's part of the student's
    ``partition_dataset`` (world size 2) in one padded tensor: world size 1
    trains on all B rows, rank r of world size 2 on rows ``[r*B/2, (r+1)*B/2)``.
    With ``spec.student_split`` False (Problem 1 unwritten: only the pipeline
    is measured, on whole batches) batch s is simply rows ``[s*B, (s+1)*B)``.
    """
    from project.data import make_collate, prepare_data
    from project.model import build_model, count_parameters

    if spec.batch_size < 2 or spec.batch_size % 2:
        raise ValueError(f"batch_size must be even and >= 2 (split over 2 ranks), got {spec.batch_size}")
    train, _, tokenizer = prepare_data(spec.dataset, "bpe", Path(spec.workdir), seed=spec.seed)
    if len(train) < spec.steps * spec.batch_size:
        raise ValueError(f"{spec.steps} steps of {spec.batch_size} sequences need {spec.steps * spec.batch_size} "
                         f"training pairs; the data has {len(train)}")
    collate = make_collate(tokenizer, spec.max_len)
    if spec.student_split:
        from data_parallel.dataset import partition_dataset

        parts = [iter(partition_dataset(rank, 2, train, spec.batch_size, collate_fn=list)) for rank in range(2)]
        rows = [next(parts[0]) + next(parts[1]) for _ in range(spec.steps)]
    else:
        rows = [[train[k] for k in range(s * spec.batch_size, (s + 1) * spec.batch_size)] for s in range(spec.steps)]
    batches = _same_width([collate(r) for r in rows], tokenizer.pad_token_id)
    model = build_model(spec.preset, tokenizer, seed=spec.seed)
    payload = {"config": model.config.to_json_string(), "state": model.state_dict(), "batches": batches}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    return {**asdict(spec), "parameters": count_parameters(model), "n_layer": model.config.n_layer,
            "n_embd": model.config.n_embd, "vocab_size": model.config.vocab_size,
            "real_tokens_per_batch": [int(b["attention_mask"].sum()) for b in batches],
            "padded_tokens_per_batch": [int(b["input_ids"].numel()) for b in batches],
            "batch_shapes": [list(b["input_ids"].shape) for b in batches]}


def _same_width(batches: list[dict], pad_id: int) -> list[dict]:
    """Right-pad every batch to the widest one (``<pad>``, label -100, mask 0): one shape for every step.

    torch's pipelining fixes the shapes it sends between stages at its first
    step; a static shape keeps every variant on the same footing. The padding
    is not counted as tokens (``attention_mask`` is 0 there).
    """
    width = max(b["input_ids"].shape[1] for b in batches)
    fill = {"input_ids": pad_id, "labels": -100, "attention_mask": 0}
    return [{k: torch.nn.functional.pad(v, (0, width - v.shape[1]), value=fill[k]) for k, v in b.items()}
            for b in batches]


def load_workload(path: Path) -> dict:
    """Load a file written by ``build_workload`` (``weights_only``: plain tensors and strings)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def fresh_model(workload: dict, device: torch.device) -> torch.nn.Module:
    """A new ``GPT2LMHeadModel`` with the workload's weights, on ``device``, in train mode."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config.from_dict(json.loads(workload["config"])))
    model.load_state_dict(workload["state"])
    return model.to(device).train()
