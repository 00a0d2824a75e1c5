"""Problem 5.2: Tensor parallel: a GPT-2 block split across ranks (see checks.py)."""
ID = "5.2"
TITLE = "Tensor parallel: a GPT-2 block split across ranks"
