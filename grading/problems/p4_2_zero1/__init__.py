"""Problem 4.2: ZeRO-1: sharded optimizer (see checks.py)."""
ID = "4.2"
TITLE = "ZeRO-1: sharded optimizer"
# the handout's suggested order and time (grading/staff/handout/plan.py): what to write, in order; hours (low, high)
PLAN = ("`ShardedOptimizer`", (2, 4))
