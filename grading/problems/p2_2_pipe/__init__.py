"""Problem 2.2: Pipeline: Pipe forward on stage workers (see checks.py)."""
ID = "2.2"
TITLE = "Pipeline: Pipe forward on stage workers"
# the handout's suggested order and time (grading/staff/handout/plan.py): what to write, in order; hours (low, high)
PLAN = ("`Pipe.forward` on the provided stage workers", (2, 3))
