"""Problem 1.2: Data parallel: gradient averaging (see checks.py)."""
ID = "1.2"
TITLE = "Data parallel: gradient averaging"
