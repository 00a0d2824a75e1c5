"""Problem 4.3: Sharded checkpoints with exact resume (see checks.py)."""
ID = "4.3"
TITLE = "Sharded checkpoints with exact resume"
