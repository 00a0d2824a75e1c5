"""Problem 2.1: Pipeline: schedule and module splitting (see checks.py)."""
ID = "2.1"
TITLE = "Pipeline: schedule and module splitting"
# the handout's suggested order and time (grading/staff/handout/plan.py): what to write, in order; hours (low, high)
PLAN = ("`clock_cycles`, then `split_module`", (1, 2))
