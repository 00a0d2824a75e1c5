#!/usr/bin/env bash
# Package the submission: every student-editable file (those with BEGIN_STUDENT regions) of the
# course's problems (grading/course.json, or GRADING_PROBLEMS; Problems 1-3 by default) and
# what submit_figures/ holds (plots + performance_summary.json + analysis.md, the written analysis)
# into submission.zip at the repository root. The student files are always packaged; a missing
# figure is a warning naming the problems it needs (scripts/run_benchmarks.py draws what the
# finished problems allow), a missing or unanswered analysis.md is a warning too.
# Afterwards it warns when the summary comes from a --quick run, and says the figures are not
# scored by the autograder.
#   bash scripts/create_submission_zip.sh [--figures_dir DIR] [--output FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
figures_dir=submit_figures
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
        --figures_dir) figures_dir="${args[i + 1]:-$figures_dir}" ;;
        --figures_dir=*) figures_dir="${args[i]#*=}" ;;
    esac
done
# the course's problems, as the grader reads them; if that fails, every student file goes in
problems="$("$python" -c 'from grading.kit.course import chosen_problems; print(",".join(chosen_problems()))' \
    2>/dev/null)" || problems=""
"$python" -m project.bench.submission ${problems:+--problems "$problems"} "$@"
"$python" -m grading.commands.benchmarks "$figures_dir"
