"""Problem 1: data parallelism (dataset partitioning, gradient averaging)."""
