"""Problem 1.2: Data parallel: gradient averaging (see checks.py)."""
ID = "1.2"
TITLE = "Data parallel: gradient averaging"
# the handout's suggested order and time (grading/staff/handout/plan.py): what to write, in order; hours (low, high)
PLAN = ("`setup_process_group`, `average_gradients`, then `train_step`, which calls it", (2, 3))
