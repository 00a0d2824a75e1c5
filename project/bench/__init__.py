"""Benchmarks of the kit's parallel training: ``python scripts/run_benchmarks.py [--quick] [--peers] [--mode ...]``.

``stats`` the arithmetic (step times, ratios, bubbles); ``workload`` the fixed weights and batches of every run;
``context`` a worker's world and stepper pieces; ``tasks`` what a worker runs; ``peers`` the reference implementations;
``pool`` the worker processes; ``options`` a run's settings, checked before torch; ``suite`` the measurement plan and
summary; ``memory`` one step's peak memory; ``ddp_peers`` (Problem 4) and ``tensor_parallel`` (Problem 5) with ranks of
their own; ``figures`` the PNGs; ``publish`` their copy in ``submit_figures/``; ``submission`` the zip.
"""
from __future__ import annotations

from common.handin import REQUIRED_FIGURES, REQUIRED_FILES, SUMMARY_NAME

__all__ = ["REQUIRED_FIGURES", "REQUIRED_FILES", "SUMMARY_NAME"]
