"""Plain-text figures of the student handout, drawn at release time (staff only, never released).

Each function returns a block of text for a fenced code block of the
README. The GPipe schedule is drawn from the staff answer of 2.1
(``grading.problems.p2_1_schedule.staff``), so the picture cannot disagree
with what the grader expects; the other figures are illustrations of the
contracts (shard boundaries, split matrices, the ZeRO paper's memory model),
none of them a student function's answer.
"""
from __future__ import annotations

import math
import string


def gpipe_schedule(microbatches: int = 4, stages: int = 3) -> str:
    """The GPipe clock cycles for ``microbatches`` x ``stages``: a stage-by-cycle grid, then the waves as lists.

    Cell ``F<i>`` in row ``stage j``, column ``k`` means task ``(i, j)``
    (micro-batch ``i`` through stage ``j``) runs in clock cycle ``k``.
    """
    from grading.problems.p2_1_schedule.staff import schedule

    waves = schedule(microbatches, stages)
    width = max(4, len(f"F{microbatches - 1}") + 2)
    lines = ["clock cycle " + "".join(f"{k:>{width}}" for k in range(len(waves)))]
    for stage in range(stages):
        cells = []
        for wave in waves:
            task = next((i for i, j in wave if j == stage), None)
            cells.append(f"{'F' + str(task) if task is not None else '.':>{width}}")
        lines.append(f"stage {stage:<5} " + "".join(cells))
    lines.append("")
    for k, wave in enumerate(waves):
        lines.append(f"cycle {k}: [" + ", ".join(f"({i}, {j})" for i, j in wave) + "]")
    return "\n".join(lines)


def bubble_table(stages: int = 2, chunks: tuple[int, ...] = (1, 2, 4, 8)) -> str:
    """The idle fraction (K-1)/(M+K-1) of a K-stage pipeline with M micro-batches, for each M of ``chunks``."""
    rows = [f"| micro-batches M | idle fraction (K-1)/(M+K-1), K = {stages} |", "|---|---|"]
    for m in chunks:
        rows.append(f"| {m} | {(stages - 1) / (m + stages - 1):.0%} |")
    return "\n".join(rows)


def zero_memory_table(billions: float = 7.5, ranks: int = 64, k: int = 12) -> str:
    """Memory per device of mixed-precision Adam, plain and under ZeRO stages 1-3 (Rajbhandari et al. 2020, Fig. 1).

    Per parameter: 2 bytes of fp16 weights, 2 of fp16 gradients and ``k`` = 12
    of optimizer state (fp32 master weights, momentum and variance).
    """
    psi, n = billions, ranks
    stages = (("plain data parallel (nothing sharded)", (2 + 2 + k) * psi),
              ("ZeRO-1: optimizer state sharded", (2 + 2) * psi + k * psi / n),
              ("ZeRO-2: + gradients sharded", 2 * psi + (2 + k) * psi / n),
              ("ZeRO-3: + parameters sharded", (2 + 2 + k) * psi / n))
    rows = [f"| {billions:g}B parameters, {ranks} GPUs | GB per GPU |", "|---|---|"]
    rows += [f"| {what} | {gb:.1f} |" for what, gb in stages]
    return "\n".join(rows)


def zero1_shards(sizes: tuple[int, ...] = (6, 3, 1), world: int = 3) -> str:
    """How ZeRO-1 lays out parameters of ``sizes`` elements over ``world`` ranks: flatten, pad, cut in equal shards."""
    total = sum(sizes)
    shard = math.ceil(total / world)
    names = string.ascii_lowercase
    flat = [names[p] for p, size in enumerate(sizes) for _ in range(size)] + ["_"] * (shard * world - total)
    cut = [" ".join(flat[r * shard:(r + 1) * shard]) for r in range(world)]
    width = max(len(c) for c in cut)
    params = ", ".join(f"{names[p]} ({size} value{'s' if size != 1 else ''})" for p, size in enumerate(sizes))
    return "\n".join([
        f"parameters {params}: P = {total}, N = {world} ranks",
        f"shard size ceil(P / N) = {shard}, so {shard * world - total} padding value(s) '_' at the end",
        "",
        "flat      [ " + " | ".join(c.ljust(width) for c in cut) + " ]",
        ("owner       " + "   ".join(f"rank {r}".ljust(width) for r in range(world))).rstrip(),
        "",
        "step():   every rank's full gradient --reduce-scatter (sum, then / N)--> rank r: mean gradient of shard r",
        "          rank r: inner optimizer step on its fp32 master copy of shard r (state for its values only)",
        "          every rank's updated shard --all-gather--> every rank: all parameters, updated",
    ])


def tensor_splits(out_features: int = 4, in_features: int = 6, world: int = 2) -> str:
    """The weight ``W`` (out x in) of one ``nn.Linear``, each entry labelled with the rank that holds it, both ways."""
    col = [[str(o * world // out_features)] * in_features for o in range(out_features)]
    row = [[str(i * world // in_features) for i in range(in_features)] for _ in range(out_features)]
    left = [f"column parallel (W: {out_features} x {in_features}, N = {world})", "split by rows = output features"]
    right = [f"row parallel (W: {out_features} x {in_features}, N = {world})", "split by columns = input features"]
    left += ["  " + " ".join(r) for r in col]
    right += ["  " + " ".join(r) for r in row]
    width = max(len(line) for line in left) + 6
    return "\n".join(a.ljust(width) + b for a, b in zip(left, right))
