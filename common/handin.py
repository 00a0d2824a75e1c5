"""What a submission hands in besides the student regions: the benchmark figures, their summary, the analysis.

The one place both sides read these names: ``project/bench`` writes and zips
them, ``grading.commands.benchmarks`` reads them from a submission.
"""
from __future__ import annotations

FIGURES_DIR = "submit_figures"
SUMMARY_NAME = "performance_summary.json"
# What a submission must hold in submit_figures/ (scripts/create_submission_zip.sh checks these).
REQUIRED_FIGURES = ("data_parallel.png", "pipeline.png", "pipeline_timeline.png")
REQUIRED_FILES = (*REQUIRED_FIGURES, SUMMARY_NAME)
# The written analysis: a template release writes for the chosen problems, answered by the student, zipped with the
# figures (missing or unanswered: a warning). The placeholder marks a question not answered yet.
ANALYSIS_NAME = "analysis.md"
ANSWER_PLACEHOLDER = "_(your answer: the numbers you measured, then your reasoning)_"
