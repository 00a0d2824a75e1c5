"""Problem 3.1, style c: one combined argument check, then a recursive swap over named_children."""
from torch import nn

from finetune.lora import LoRALinear


def apply_lora(model, target_names, rank=2, alpha=4):
    # BEGIN_STUDENT 3.1
    names = tuple(target_names)
    if not names or rank < 1 or len(set(names)) < len(names):
        raise ValueError(f"apply_lora: bad arguments (targets={names!r}, rank={rank})")
    lookup = dict(model.named_modules())
    bad = [name for name in names if not name or not isinstance(lookup.get(name), nn.Linear)]
    if bad:
        raise ValueError(f"apply_lora: not Linear modules of the model: {bad}")

    def swap(module, prefix):
        for child_name, child in list(module.named_children()):
            full = f"{prefix}.{child_name}" if prefix else child_name
            if full in names:
                module.add_module(child_name, LoRALinear(child, rank, alpha))
            else:
                swap(child, full)

    for param in model.parameters():
        param.requires_grad_(False)
    swap(model, "")
    return model
    # END_STUDENT 3.1
