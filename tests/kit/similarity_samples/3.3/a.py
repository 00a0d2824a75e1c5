"""Problem 3.3, style a: a validation loop over (label, value); the config built key by key."""


def build_config(world_size, micro_batch, grad_accum, precision="fp32"):
    # BEGIN_STUDENT 3.3
    for label, number in (("world_size", world_size), ("micro_batch", micro_batch), ("grad_accum", grad_accum)):
        if type(number) is not int or number <= 0:
            raise ValueError(f"{label} must be a positive int, got {number!r}")
    if precision not in ("fp32", "fp16", "bf16"):
        raise ValueError(f"unknown precision {precision!r}")
    config = {"train_batch_size": world_size * micro_batch * grad_accum,
              "train_micro_batch_size_per_gpu": micro_batch,
              "gradient_accumulation_steps": grad_accum}
    config["zero_optimization"] = {"stage": 2, "reduce_scatter": True}
    config["gradient_clipping"] = 0
    config["zero_allow_untested_optimizer"] = True
    if precision == "fp16":
        config["fp16"] = {"enabled": True}
    elif precision == "bf16":
        config["bf16"] = {"enabled": True}
    return config
    # END_STUDENT 3.3


def train_microbatch(engine, inputs, targets, loss_fn):
    # BEGIN_STUDENT 3.3
    output = engine(inputs)
    loss = loss_fn(output, targets)
    engine.backward(loss)
    engine.step()
    return loss.item()
    # END_STUDENT 3.3
