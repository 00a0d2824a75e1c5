"""Problem 4.1: DDP: overlapped bucketed all-reduce (see checks.py)."""
ID = "4.1"
TITLE = "DDP: overlapped bucketed all-reduce"
