#!/usr/bin/env bash
# Package the submission: every student-editable file (those with BEGIN_STUDENT regions) and
# submit_figures/ (plots + performance_summary.json) into submission.zip at the repository root.
# Refuses when a required figure or the summary is missing: run scripts/run_benchmarks.py first.
#   bash scripts/create_submission_zip.sh [--figures_dir DIR] [--output FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" -m project.bench.submission "$@"
