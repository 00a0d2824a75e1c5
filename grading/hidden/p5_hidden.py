"""Hidden Problem 5 cases: 3-way splits (a world size the visible checks do not use) inside a process group
that is not the default one: 3 of 4 ranks, chosen by the course secret (``grading.hidden.inputs``), so a
rank's place in the group differs from its global rank and code that ignores ``group`` fails. The GPT-2 runs
with PyTorch's fused (sdpa) attention."""
from __future__ import annotations

from grading.problems.p5_1_layers.checks import (check_column_forward, check_input_grads, check_region_functions,
                                        check_row_forward)
from grading.problems.p5_2_gpt2.checks import check_forward, check_grads
from grading.kit.data import hidden
from grading.engine.rubric import Case, Criterion

SUBGROUP = {"group_ranks": hidden("p5")["group_ranks"]}

CASES = [
    Case("p5_layers_3rank", "grading.problems.p5_1_layers.checks:probe_layers", world_size=4, init_group=True,
         args=dict(SUBGROUP), timeout_s=90, criteria=(
             Criterion("5.1.region_functions_3rank", "3-rank subgroup: the parallel-region functions", 1,
                       check_region_functions, hidden=True),
             Criterion("5.1.column_forward_3rank", "3-rank subgroup: column-parallel output slices", 1,
                       check_column_forward, hidden=True),
             Criterion("5.1.row_forward_3rank", "3-rank subgroup: row-parallel output", 1, check_row_forward,
                       hidden=True),
             Criterion("5.1.input_grads_3rank", "3-rank subgroup: input gradients", 1, check_input_grads,
                       hidden=True),
         )),
    Case("p5_gpt2_3rank", "grading.problems.p5_2_gpt2.checks:probe_gpt2", world_size=4, init_group=True, timeout_s=150,
         args={**SUBGROUP, "attention": "sdpa", "sgd": False}, criteria=(
             Criterion("5.2.forward_3rank", "3-rank subgroup, sdpa attention: logits and loss of the split GPT-2", 2,
                       check_forward, hidden=True),
             Criterion("5.2.grads_3rank", "3-rank subgroup, sdpa attention: the ranks' gradients", 1, check_grads,
                       hidden=True),
         )),
]
