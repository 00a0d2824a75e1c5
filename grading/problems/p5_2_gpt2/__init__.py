"""Problem 5.2: Tensor parallel: a GPT-2 block split across ranks (see checks.py)."""
ID = "5.2"
TITLE = "Tensor parallel: a GPT-2 block split across ranks"
# the handout's suggested order and time (grading/staff/handout/plan.py): what to write, in order; hours (low, high)
PLAN = ("`parallelize_block`", (2, 3))
