"""Benchmarks of the kit's parallel training, measured the way a systems paper would.

    python scripts/run_benchmarks.py [--quick] [--peers] [--mode student|grader]

Modules (each small, one concept):
- ``stats``     pure arithmetic: run time from step stamps, the step time, ratios, medians, bubbles;
- ``workload``  the one fixed workload (model weights + global batches) every run trains on;
- ``context``   one worker's world (role, rank, device, workload) and the stepper pieces;
- ``tasks``     what a worker process runs on the student API (ours), its command loop (``serve``);
- ``peers``     the reference implementations (DDP, flat all-reduce, torch GPipe, PEFT) and gradient checks;
- ``pool``      the worker processes (one solo rank, a pair of ranks), started by ``project.launch``;
- ``options``   what a run needs (``Options``): defaults and checks, light at import (checked before torch);
- ``suite``     the measurement plan (warm-up, alternating repeats) and the summary JSON;
- ``memory``    one step's peak memory with and without activation checkpointing (fresh processes);
- ``ddp_peers`` (Problem 4) and ``tensor_parallel`` (Problem 5): groups with rank processes of their own;
- ``figures``   the PNG plots;
- ``publish``   each run's own folder, and the copy in ``submit_figures/`` (what it replaces is kept);
- ``submission`` the submission zip (student files + ``submit_figures/``).
"""
from __future__ import annotations

from common.handin import REQUIRED_FIGURES, REQUIRED_FILES, SUMMARY_NAME

__all__ = ["REQUIRED_FIGURES", "REQUIRED_FILES", "SUMMARY_NAME"]
