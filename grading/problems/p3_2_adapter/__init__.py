"""Problem 3.2: Fine-tuning: save and load adapters (see checks.py)."""
ID = "3.2"
TITLE = "Fine-tuning: save and load adapters"
# the handout's suggested order and time (grading/staff/handout/plan.py): what to write, in order; hours (low, high)
PLAN = ("`save_adapter`, `load_adapter`", (1, 2))
