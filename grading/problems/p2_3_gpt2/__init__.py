"""Problem 2.3: Pipeline: GPT-2 as pipeline stages (see checks.py)."""
ID = "2.3"
TITLE = "Pipeline: GPT-2 as pipeline stages"
