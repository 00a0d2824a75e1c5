"""Problem 2.3: Pipeline: GPT-2 as pipeline stages (see checks.py)."""
ID = "2.3"
TITLE = "Pipeline: GPT-2 as pipeline stages"
# the handout's suggested order and time (grading/staff/handout/plan.py): what to write, in order; hours (low, high)
PLAN = ("`Blocks.forward`, then `gpt2_stages`", (2, 3))
