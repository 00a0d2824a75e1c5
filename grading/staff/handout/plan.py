"""The suggested order and time per problem: one table here, shown in the overview and in each problem's section.

A problem's plan is derived from its sub-problems (the kit's folders, in id
order): "1.1 (...), then 1.2 (...)", its hours the sum of theirs. What staff
write is one ``Step`` per sub-problem (what to write first, and a time
estimate in hours) and, where it helps, a closing note per problem. Times
are rough estimates for a student new to ``torch.distributed``, for writing
and checking the code; the training runs' own time comes on
top. A sub-problem without a step is refused when the handout is written.
"""
from __future__ import annotations

from dataclasses import dataclass

from grading.problems import titles

PLAN_FILE = "grading/staff/handout/plan.py"


@dataclass(frozen=True)
class Step:
    """One sub-problem's part of the plan: what to write, in order (markdown), and its hours (low, high)."""

    what: str
    hours: tuple[int, int]


@dataclass(frozen=True)
class Plan:
    """One problem's suggested order of work and its time estimate in hours (low, high)."""

    order: str
    hours: tuple[int, int]

    @property
    def time(self) -> str:
        return hours(*self.hours)


def hours(low: int, high: int) -> str:
    """A time estimate in words: "1 hour", "2 hours", "1-2 hours" (a range whose ends are equal is one number)."""
    span = f"{low:g}" if low == high else f"{low:g}-{high:g}"
    return f"{span} hour{'' if span == '1' else 's'}"


STEPS = {
    "1.1": Step("`Partition`, `partition_indices`, then `partition_dataset`", (1, 2)),
    "1.2": Step("`setup_process_group`, `average_gradients`, then `train_step`, which calls it", (2, 3)),
    "2.1": Step("`clock_cycles`, then `split_module`", (1, 2)),
    "2.2": Step("`Pipe.forward` on the provided stage workers", (2, 3)),
    "2.3": Step("`Blocks.forward`, then `gpt2_stages`", (2, 3)),
    "3.1": Step("`apply_lora`", (1, 2)),
    "3.2": Step("`save_adapter`, `load_adapter`", (1, 2)),
    "3.3": Step("`build_config`, `train_microbatch`", (2, 2)),
    "4.1": Step("`BucketedDDP`", (3, 4)),
    "4.2": Step("`ShardedOptimizer`", (2, 4)),
    "4.3": Step("`save_sharded`, `load_sharded`", (3, 4)),
    "5.1": Step("the two autograd functions, then the column and row parallel layers", (3, 5)),
    "5.2": Step("`parallelize_block`", (2, 3)),
}
NOTES = {"4": "`run_capstone.py` needs all three"}       # closes the problem's order, after its last step
WRITE_UP = Plan("after the problems: `scripts/run_benchmarks.py`, then the written analysis", (2, 4))


def _listed(parts: list[str]) -> str:
    """``a``; ``a, then b``; ``a, b, then c``."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + ", then " + parts[-1]


def plan(problem: str) -> Plan:
    """The plan of Problem ``problem``: its sub-problems' steps in id order, their hours summed; ValueError when
    it has no sub-problem or one of them has no step."""
    subs = [sub for sub in titles() if sub.split(".")[0] == problem]
    if not subs:
        raise ValueError(f"no suggested order and time for Problem {problem}: it has no sub-problem")
    missing = [sub for sub in subs if sub not in STEPS]
    if missing:
        raise ValueError(f"no suggested order and time for {', '.join(missing)}: add a Step to STEPS in "
                         f"{PLAN_FILE}")
    order = _listed([f"{sub} ({STEPS[sub].what})" for sub in subs])
    if problem in NOTES:
        order += f"; {NOTES[problem]}"
    return Plan(order, (sum(STEPS[s].hours[0] for s in subs), sum(STEPS[s].hours[1] for s in subs)))


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
    rows.append(f"| **in all** | | **{hours(low, high)}** |")
    return "\n".join(rows)
