"""Problem 3.3: Fine-tuning: DeepSpeed ZeRO config and micro-batch step (see checks.py)."""
ID = "3.3"
TITLE = "Fine-tuning: DeepSpeed ZeRO config and micro-batch step"
# the handout's suggested order and time (grading/staff/handout/plan.py): what to write, in order; hours (low, high)
PLAN = ("`build_config`, `train_microbatch`", (2, 2))
