"""Problem 2.2: Pipeline: Pipe forward on stage workers (see checks.py)."""
ID = "2.2"
TITLE = "Pipeline: Pipe forward on stage workers"
