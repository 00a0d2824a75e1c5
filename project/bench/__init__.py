"""Benchmarks of the kit's parallel training, measured the way a systems paper would.

    python scripts/run_benchmarks.py [--quick] [--peers] [--mode student|grader]

Modules (each small, one concept):
- ``stats``     pure arithmetic: run time from step stamps, paired ratios, medians, bubbles;
- ``workload``  the one fixed workload (model weights + global batches) every run trains on;
- ``tasks``     what a worker process runs on the student API (ours) and on the reference peers;
- ``pool``      the worker processes (one solo rank, a pair of ranks) and the command loop;
- ``suite``     the measurement plan (warm-up, alternating repeats) and the summary JSON;
- ``memory``    one step's peak memory with and without activation checkpointing (fresh processes);
- ``figures``   the PNG plots;
- ``submission`` the submission zip (student files + ``submit_figures/``).
"""
from __future__ import annotations

from grading.kit.handin import REQUIRED_FIGURES, REQUIRED_FILES, SUMMARY_NAME

__all__ = ["REQUIRED_FIGURES", "REQUIRED_FILES", "SUMMARY_NAME"]
