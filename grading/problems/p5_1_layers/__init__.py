"""Problem 5.1: Tensor parallel: column and row parallel layers (see checks.py)."""
ID = "5.1"
TITLE = "Tensor parallel: column and row parallel layers"
# the handout's suggested order and time (grading/staff/handout/plan.py): what to write, in order; hours (low, high)
PLAN = ("the two autograd functions, then the column and row parallel layers", (3, 5))
