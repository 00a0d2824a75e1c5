"""The suggested order and time per problem: one table here, shown in the overview and in each problem's section.

Times are rough estimates for a student new to ``torch.distributed``, for
writing and checking the code; the runs' own minutes (given in each
section) come on top. Staff change them here.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """One problem's suggested order of work and its time estimate in hours (low, high)."""

    order: str
    hours: tuple[int, int]

    @property
    def time(self) -> str:
        return f"{self.hours[0]}-{self.hours[1]} hours"


PLANS = {
    "1": Plan("1.1 (`Partition`, `partition_indices`, then `partition_dataset`), then 1.2 (`setup_process_group`, "
              "`average_gradients`, then `train_step`, which calls it)", (3, 5)),
    "2": Plan("2.1 (`clock_cycles`, then `split_module`), 2.2 (`Pipe.forward` on the provided stage workers), "
              "then 2.3 (`Blocks.forward`, then `gpt2_stages`)", (5, 8)),
    "3": Plan("3.1 (`apply_lora`), 3.2 (`save_adapter`, `load_adapter`), then 3.3 (`build_config`, "
              "`train_microbatch`)", (4, 6)),
    "4": Plan("4.1 (`BucketedDDP`), 4.2 (`ShardedOptimizer`), then 4.3 (`save_sharded`, `load_sharded`); "
              "`run_capstone.py` needs all three", (8, 12)),
    "5": Plan("5.1 (the two autograd functions, then the column and row parallel layers), then 5.2 "
              "(`parallelize_block`)", (5, 8)),
}
WRITE_UP = Plan("after the problems: `scripts/run_benchmarks.py`, then the written analysis", (2, 4))


def plan(problem: str) -> Plan:
    """The plan of Problem ``problem``; ValueError when it has none."""
    if problem not in PLANS:
        raise ValueError(f"no suggested order and time for Problem {problem} (grading/staff/handout/plan.py)")
    return PLANS[problem]


def line(problem: str) -> str:
    """The sentence of Problem ``problem``'s section: its order and time."""
    chosen = plan(problem)
    return f"**Suggested order and time.** {chosen.order}; about {chosen.time}."


def table(problems: tuple[str, ...]) -> str:
    """The overview's table: one row per chosen problem, then the benchmarks and written analysis, then the sum."""
    rows = ["| step | order | time |", "|---|---|---|"]
    rows += [f"| Problem {p} | {plan(p).order} | {plan(p).time} |" for p in problems]
    rows.append(f"| figures and analysis | {WRITE_UP.order} | {WRITE_UP.time} |")
    low = sum(plan(p).hours[0] for p in problems) + WRITE_UP.hours[0]
    high = sum(plan(p).hours[1] for p in problems) + WRITE_UP.hours[1]
    rows.append(f"| **in all** | | **{low}-{high} hours** |")
    return "\n".join(rows)
