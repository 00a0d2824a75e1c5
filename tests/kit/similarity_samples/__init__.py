"""Test data of the similarity report: independent solutions per problem, and a batch generator (make.py)."""
