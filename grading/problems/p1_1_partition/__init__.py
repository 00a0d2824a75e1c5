"""Problem 1.1: Data parallel: dataset partitioning (see checks.py)."""
ID = "1.1"
TITLE = "Data parallel: dataset partitioning"
