"""Hidden Problem 1.2 case: gradient averaging on 3 ranks (a world size the visible checks do not use)."""
from __future__ import annotations

from grading.checks.p1_data_parallel import check_grads
from grading.rubric import Case, Criterion

CASES = [
    Case("p1_comm_3rank", "grading.checks.p1_data_parallel:probe_comm", world_size=3, init_group=True,
         args={"student_setup": False, "train_step": False}, timeout_s=90, criteria=(
             Criterion("1.2.grads_3rank", "3-rank averaged grads equal the serial global-batch grads", 2,
                       check_grads, hidden=True),
         )),
]
