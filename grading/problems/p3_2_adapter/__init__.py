"""Problem 3.2: Fine-tuning: save and load adapters (see checks.py)."""
ID = "3.2"
TITLE = "Fine-tuning: save and load adapters"
