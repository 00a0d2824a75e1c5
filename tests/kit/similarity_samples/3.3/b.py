"""Problem 3.3, style b: a nested checker function and dict(...) keyword construction."""
from finetune.zero import PRECISIONS


def build_config(world_size, micro_batch, grad_accum, precision="fp32"):
    # BEGIN_STUDENT 3.3
    def positive(value, label):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{label} must be an integer")
        if value < 1:
            raise ValueError(f"{label} must be >= 1")
        return value

    ws = positive(world_size, "world_size")
    mb = positive(micro_batch, "micro_batch")
    ga = positive(grad_accum, "grad_accum")
    if precision not in PRECISIONS:
        raise ValueError(precision)
    return dict(
        train_batch_size=ws * mb * ga,
        train_micro_batch_size_per_gpu=mb,
        gradient_accumulation_steps=ga,
        gradient_clipping=0.0,
        zero_allow_untested_optimizer=True,
        zero_optimization=dict(stage=2),
        fp16=dict(enabled=precision == "fp16"),
        bf16=dict(enabled=precision == "bf16"),
    )
    # END_STUDENT 3.3


def train_microbatch(engine, inputs, targets, loss_fn):
    # BEGIN_STUDENT 3.3
    logits = engine.forward(inputs)
    value = loss_fn(logits, targets)
    engine.backward(value)
    engine.step()
    return float(value.detach().cpu())
    # END_STUDENT 3.3
