"""Problem 3.1: Fine-tuning: apply LoRA (see checks.py)."""
ID = "3.1"
TITLE = "Fine-tuning: apply LoRA"
# the handout's suggested order and time (grading/staff/handout/plan.py): what to write, in order; hours (low, high)
PLAN = ("`apply_lora`", (1, 2))
