"""Problem 2.1: Pipeline: schedule and module splitting (see checks.py)."""
ID = "2.1"
TITLE = "Pipeline: schedule and module splitting"
