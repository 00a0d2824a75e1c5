"""Problem 3.1: Fine-tuning: apply LoRA (see checks.py)."""
ID = "3.1"
TITLE = "Fine-tuning: apply LoRA"
