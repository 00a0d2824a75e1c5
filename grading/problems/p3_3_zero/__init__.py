"""Problem 3.3: Fine-tuning: DeepSpeed ZeRO config and micro-batch step (see checks.py)."""
ID = "3.3"
TITLE = "Fine-tuning: DeepSpeed ZeRO config and micro-batch step"
