"""What a submission hands in besides the student regions: the benchmark figures and their summary.

The one place both sides read these names: ``project/bench`` writes and zips
them, ``grading.commands.benchmarks`` reads them from a submission. Plain
constants, no imports, so ``project`` may import it and ``grading`` never has
to import ``project``.
"""
from __future__ import annotations

FIGURES_DIR = "submit_figures"
SUMMARY_NAME = "performance_summary.json"
# What a submission must hold in submit_figures/ (scripts/create_submission_zip.sh checks these).
REQUIRED_FIGURES = ("data_parallel.png", "pipeline.png", "pipeline_timeline.png")
REQUIRED_FILES = (*REQUIRED_FIGURES, SUMMARY_NAME)
