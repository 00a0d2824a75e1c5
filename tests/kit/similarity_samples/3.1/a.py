"""Problem 3.1, style a: get_submodule lookups, a seen-set, requires_grad_ on the whole model."""
from torch import nn

from finetune.lora import LoRALinear


def apply_lora(model, target_names, rank=2, alpha=4):
    # BEGIN_STUDENT 3.1
    targets = list(target_names)
    if rank < 1:
        raise ValueError("rank must be positive")
    if len(targets) == 0:
        raise ValueError("no targets given")
    seen = set()
    found = {}
    for t in targets:
        if t in seen:
            raise ValueError(f"duplicate target {t}")
        seen.add(t)
        try:
            sub = model.get_submodule(t)
        except AttributeError:
            raise ValueError(f"missing module {t}") from None
        if not t or not isinstance(sub, nn.Linear):
            raise ValueError(f"{t} is not nn.Linear")
        found[t] = sub
    model.requires_grad_(False)
    for t, linear in found.items():
        owner, _, attr = t.rpartition(".")
        parent = model.get_submodule(owner) if owner else model
        setattr(parent, attr, LoRALinear(linear, rank=rank, alpha=alpha))
    return model
    # END_STUDENT 3.1
