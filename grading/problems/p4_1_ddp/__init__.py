"""Problem 4.1: DDP: overlapped bucketed all-reduce (see checks.py)."""
ID = "4.1"
TITLE = "DDP: overlapped bucketed all-reduce"
# the handout's suggested order and time (grading/staff/handout/plan.py): what to write, in order; hours (low, high)
PLAN = ("`BucketedDDP`", (3, 4))
