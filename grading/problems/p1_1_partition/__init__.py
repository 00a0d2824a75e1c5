"""Problem 1.1: Data parallel: dataset partitioning (see checks.py)."""
ID = "1.1"
TITLE = "Data parallel: dataset partitioning"
# the handout's suggested order and time (grading/staff/handout/plan.py): what to write, in order; hours (low, high)
PLAN = ("`Partition`, `partition_indices`, then `partition_dataset`", (1, 2))
