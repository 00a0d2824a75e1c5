"""Problem 3.3, style c: every bad size named at once; the precision flags set in a loop."""
from finetune.zero import PRECISIONS


def build_config(world_size, micro_batch, grad_accum, precision="fp32"):
    # BEGIN_STUDENT 3.3
    bad = [n for n, v in zip(("world_size", "micro_batch", "grad_accum"), (world_size, micro_batch, grad_accum))
           if not (isinstance(v, int) and not isinstance(v, bool) and v > 0)]
    if bad or precision not in PRECISIONS:
        raise ValueError(f"build_config: invalid {bad or ['precision']}")
    cfg = {}
    cfg["train_micro_batch_size_per_gpu"] = micro_batch
    cfg["gradient_accumulation_steps"] = grad_accum
    cfg["train_batch_size"] = micro_batch * grad_accum * world_size
    cfg["zero_optimization"] = {"stage": 2, "contiguous_gradients": True, "overlap_comm": False}
    cfg["gradient_clipping"] = 0.0
    cfg["zero_allow_untested_optimizer"] = True
    for p in ("fp16", "bf16"):
        cfg[p] = {"enabled": precision == p}
    return cfg
    # END_STUDENT 3.3


def train_microbatch(engine, inputs, targets, loss_fn):
    # BEGIN_STUDENT 3.3
    loss_tensor = loss_fn(engine(inputs), targets)
    engine.backward(loss_tensor)
    engine.step()
    return loss_tensor.detach().item()
    # END_STUDENT 3.3
