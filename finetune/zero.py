"""DeepSpeed ZeRO fine-tuning: the config (3.3), one micro-batch step (3.3), and the engine.

Student parts (Problem 3.3):
- ``build_config(world_size, micro_batch, grad_accum, precision)``: the
  DeepSpeed config dict for ZeRO stage 2.
- ``train_microbatch(engine, inputs, targets, loss_fn)``: one micro-batch
  through the engine.

Provided: ``init_engine(model, optimizer, config)`` wraps
``deepspeed.initialize`` for the process group that already exists (gloo on
CPU, NCCL on GPUs), and ``prepare_deepspeed()`` which it calls first.

On the CPU accelerator DeepSpeed would JIT-compile a shared-memory
all-reduce op (``deepspeed_shm_comm``) with a C++ compiler; only
``inference_all_reduce`` uses it (ZeRO training communicates through
``torch.distributed``), so ``prepare_deepspeed`` marks it incompatible and
nothing is compiled.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

PRECISIONS = ("fp32", "fp16", "bf16")


def build_config(
    world_size: int, micro_batch: int, grad_accum: int, precision: str = "fp32"
) -> dict[str, Any]:
    """Return a DeepSpeed config dict for ZeRO stage 2 data-parallel training.

    Args:
        world_size: number of data-parallel ranks, an int >= 1.
        micro_batch: samples per rank per forward/backward, an int >= 1.
        grad_accum: micro-batches accumulated per optimizer step, an int >= 1.
        precision: ``"fp32"``, ``"fp16"`` or ``"bf16"``.

    The dict must hold:
    - ``"train_batch_size"``: the global batch of one optimizer step,
      ``world_size * micro_batch * grad_accum``;
    - ``"train_micro_batch_size_per_gpu"``: ``micro_batch``;
    - ``"gradient_accumulation_steps"``: ``grad_accum``;
    - ``"zero_optimization"``: ``"stage": 2`` and no offload (no
      ``offload_optimizer``/``offload_param`` to a device other than
      ``"none"``); further ZeRO settings in it (e.g. ``"overlap_comm"``) are
      free;
    - ``"gradient_clipping"``: ``0.0`` (off; DeepSpeed clips at 1.0 when
      the key is absent);
    - ``"zero_allow_untested_optimizer"``: ``True`` (the optimizer is a
      plain ``torch.optim`` one);
    - ``"fp16": {"enabled": ...}`` and ``"bf16": {"enabled": ...}``: true
      exactly for the chosen precision (both false for ``"fp32"``).

    Other top-level keys may be added (e.g. ``steps_per_print``). The
    entries listed above must have exactly these values and kinds: the three
    sizes and the stage as ``int``, the flags as ``bool`` (``True``, not
    ``1``), ``gradient_clipping`` a number equal to 0.

    Returns:
        The config as a ``dict`` (what ``deepspeed.initialize`` takes as
        ``config``), not its JSON text.

    Raises:
        ValueError: a size that is not an ``int`` >= 1 (``True``, ``2.0`` and
        ``"2"`` are not ints here: ValueError, never a TypeError from
        comparing them), or an unknown precision.
    """
    # BEGIN_STUDENT 3.3
    sizes = {"world_size": world_size, "micro_batch": micro_batch, "grad_accum": grad_accum}
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"build_config: {name} must be an int >= 1, got {value!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"build_config: precision must be one of {PRECISIONS}, got {precision!r}")
    return {
        "train_batch_size": world_size * micro_batch * grad_accum,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "zero_optimization": {"stage": 2},
        "gradient_clipping": 0.0,
        "zero_allow_untested_optimizer": True,
        "fp16": {"enabled": precision == "fp16"},
        "bf16": {"enabled": precision == "bf16"},
    }
    # END_STUDENT 3.3


def train_microbatch(
    engine: Any,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> float:
    """Run one micro-batch through a DeepSpeed engine and return its loss.

    Forward ``engine(inputs)``, ``loss = loss_fn(outputs, targets)`` with the
    given ``loss_fn`` (whatever it computes), then
    ``engine.backward(loss)`` and ``engine.step()``, each exactly once per
    call (``engine.backward``, not ``loss.backward()``: the engine scales the
    loss, and refuses an unscaled backward in fp16).
    Call ``engine.step()`` after every micro-batch: the engine counts them
    and only updates the weights (and ``engine.global_steps``) at the end of
    each ``gradient_accumulation_steps`` group. DeepSpeed owns accumulation
    and loss scaling: do not divide the loss by the accumulation steps
    yourself, do not call ``zero_grad`` and do not step the optimizer you
    passed to ``deepspeed.initialize``.

    Returns:
        The micro-batch loss as a Python float (as ``loss_fn`` returned it,
        detached, undivided).
    """
    # BEGIN_STUDENT 3.3
    loss = loss_fn(engine(inputs), targets)
    engine.backward(loss)
    engine.step()
    return float(loss.detach())
    # END_STUDENT 3.3


_SHM_COMM_OP = "deepspeed_shm_comm"


def prepare_deepspeed() -> None:
    """Keep DeepSpeed from compiling ops a ZeRO training run does not use (provided).

    Marks the CPU shared-memory all-reduce op (``deepspeed_shm_comm``, used
    only by ``inference_all_reduce``) as incompatible, so creating the
    communication backend does not JIT-build it with g++. Call before the
    first ``deepspeed.initialize`` / ``deepspeed.init_distributed`` in the
    process (``init_engine`` does); later calls change nothing.
    """
    import deepspeed.ops

    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compatible, dict):
        compatible[_SHM_COMM_OP] = False


def init_engine(model: nn.Module, optimizer: torch.optim.Optimizer, config: dict[str, Any]) -> Any:
    """Wrap ``model`` and ``optimizer`` in a DeepSpeed engine (provided).

    The default ``torch.distributed`` process group must already exist
    (``data_parallel.setup_process_group``, ``torchrun``, the grader); its
    ranks are the data-parallel ranks. Sets ``LOCAL_RANK`` (DeepSpeed asserts
    it) to the process's rank when unset, which on a single machine is also
    its GPU index. With NCCL, DeepSpeed moves the model to that GPU; with
    gloo it trains on the CPU (``DS_ACCELERATOR=cpu`` is set when DeepSpeed
    is not imported yet, since gloo ranks may share one GPU).

    Args:
        model: the module to train; parameters with ``requires_grad=False``
            stay frozen.
        optimizer: a ``torch.optim`` optimizer over the trainable
            parameters (e.g. ``SGD(adapter_parameters(model).values(), lr)``).
        config: a DeepSpeed config dict such as ``build_config(...)`` returns.

    Returns:
        The ``DeepSpeedEngine``; call it like the model and use
        ``train_microbatch`` to train.

    Raises:
        RuntimeError: no default process group, or a gloo group while
            DeepSpeed was already imported with a GPU accelerator.
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("init_engine: initialise the torch.distributed process group first")
    os.environ.setdefault("LOCAL_RANK", str(dist.get_rank()))
    if dist.get_backend() == "gloo" and "deepspeed" not in sys.modules:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # gloo ranks may share one GPU: train on the CPU
    prepare_deepspeed()
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    if dist.get_backend() == "gloo" and get_accelerator().device_name() != "cpu":
        raise RuntimeError(
            "init_engine: the process group is gloo but DeepSpeed picked the "
            f"{get_accelerator().device_name()!r} accelerator; set DS_ACCELERATOR=cpu before importing deepspeed"
        )
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=config, dist_init_required=False
    )
    return engine
