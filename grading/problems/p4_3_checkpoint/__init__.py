"""Problem 4.3: Sharded checkpoints with exact resume (see checks.py)."""
ID = "4.3"
TITLE = "Sharded checkpoints with exact resume"
# the handout's suggested order and time (grading/staff/handout/plan.py): what to write, in order; hours (low, high)
PLAN = ("`save_sharded`, `load_sharded`", (3, 4))
