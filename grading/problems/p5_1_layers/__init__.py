"""Problem 5.1: Tensor parallel: column and row parallel layers (see checks.py)."""
ID = "5.1"
TITLE = "Tensor parallel: column and row parallel layers"
