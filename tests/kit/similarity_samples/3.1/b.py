"""Problem 3.1, style b: collect every problem first (Counter for duplicates), walk dotted paths by hand."""

from torch import nn

from finetune.lora import LoRALinear


def apply_lora(model, target_names, rank=2, alpha=4):
    # BEGIN_STUDENT 3.1
    import collections
    wanted = list(target_names)
    problems = []
    if rank < 1:
        problems.append(f"rank={rank} < 1")
    if not wanted:
        problems.append("empty target list")
    dupes = [n for n, c in collections.Counter(wanted).items() if c > 1]
    if dupes:
        problems.append(f"duplicates {dupes}")
    table = {n: m for n, m in model.named_modules() if n}
    for n in wanted:
        if n not in table:
            problems.append(f"{n!r} not found")
        elif not isinstance(table[n], nn.Linear):
            problems.append(f"{n!r} is not a Linear layer")
    if problems:
        raise ValueError("apply_lora: " + "; ".join(problems))
    for p in model.parameters():
        p.requires_grad = False
    for n in wanted:
        *path, leaf = n.split(".")
        holder = model
        for step in path:
            holder = getattr(holder, step)
        setattr(holder, leaf, LoRALinear(table[n], rank, alpha))
    return model
    # END_STUDENT 3.1
