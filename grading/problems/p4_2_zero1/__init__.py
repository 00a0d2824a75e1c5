"""Problem 4.2: ZeRO-1: sharded optimizer (see checks.py)."""
ID = "4.2"
TITLE = "ZeRO-1: sharded optimizer"
