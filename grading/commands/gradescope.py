"""The Gradescope autograder bundle: ``python -m grading gradescope OUT_DIR``.

``OUT_DIR/autograder.zip`` is what one uploads; ``OUT_DIR/source/`` is the
same tree unpacked (Gradescope unpacks the zip into ``/autograder/source``)::

    source/setup.sh          installs requirements.txt (pinned; CPU build of torch)
    source/run_autograder    grades /autograder/submission into /autograder/results/results.json
    source/requirements.txt
    source/grading/ ...      the grader, its staff parts included (grading/staff, grading/problems/*/staff.py)
    source/data_parallel/ ... the student files with every region emptied (no reference solution)

The bundle holds no reference solution: the grader splices the submission's
region bodies into the kit's files, and judges against its own references
(``grading/references``), so the region bodies are never needed.

``run_autograder`` writes a placeholder results.json first and checks the
real one at the end (``python -m grading.commands.gradescope finalize``), so
Gradescope always gets a report, even when the grader is killed. Every path
can be moved with environment variables (a test runs it on a temporary
folder laid out like ``/autograder``).
"""
from __future__ import annotations

import json
import shutil
import sys
import zipfile
from pathlib import Path

from grading.kit.secret import SECRET_FILE
from grading.commands.release import release, staff_files
from grading.kit.course import DEFAULT_PROBLEMS
from grading.kit.quick_exit import run_and_exit

LOCAL_CACHES = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".ipynb_checkpoints"}

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope setup: install the kit's pinned requirements, with the CPU build of torch
# (the PyPI default wheel pulls in gigabytes of CUDA libraries that the grader never uses).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${GRADING_PYTHON:-python3}"
"$PYTHON" -m pip install --no-cache-dir --upgrade pip
"$PYTHON" -m pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu \\
    "$(grep -E '^torch==' requirements.txt)"
"$PYTHON" -m pip install --no-cache-dir -r requirements.txt
"$PYTHON" -c "import torch, transformers, deepspeed; print('torch', torch.__version__)"
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope entry point: grade the submission into results.json. Always leaves a results.json.
# Overridable (defaults in brackets): AUTOGRADER_ROOT [/autograder], GRADING_SOURCE [$AUTOGRADER_ROOT/source],
# GRADING_SUBMISSION [$AUTOGRADER_ROOT/submission], GRADING_RESULTS [$AUTOGRADER_ROOT/results/results.json],
# GRADING_PYTHON [python3], GRADING_ARGS [extra arguments for "grade", e.g. --problem 1],
# GRADING_TOTAL_TIMEOUT [2400 seconds for the whole run; set Gradescope's limit above it].
set -u
ROOT="${AUTOGRADER_ROOT:-/autograder}"
SOURCE="${GRADING_SOURCE:-$ROOT/source}"
SUBMISSION="${GRADING_SUBMISSION:-$ROOT/submission}"
RESULTS="${GRADING_RESULTS:-$ROOT/results/results.json}"
PYTHON="${GRADING_PYTHON:-python3}"
mkdir -p "$(dirname "$RESULTS")"
cd "$SOURCE" || exit 1
"$PYTHON" -m grading.commands.gradescope placeholder "$RESULTS"
# shellcheck disable=SC2086
timeout --kill-after=30 "${GRADING_TOTAL_TIMEOUT:-2400}" \\
    "$PYTHON" -m grading grade "$SUBMISSION" --json "$RESULTS" --quiet ${GRADING_ARGS:-}
code=$?
"$PYTHON" -m grading.commands.gradescope finalize "$RESULTS" "$code"
exit 0
"""


def build_bundle(kit_root: Path, out_dir: Path, problems: tuple[str, ...] = DEFAULT_PROBLEMS,
                 course_secret: str = "") -> Path:
    """Write ``out_dir/source/`` and ``out_dir/autograder.zip``; return the zip's path.

    The tree is the student release of ``kit_root`` for ``problems`` (regions
    emptied) plus the staff parts (``grading/staff`` and each chosen folder's
    ``staff.py``: answers and hidden inputs; with ``course_secret`` written to
    ``grading/staff/course_secret.txt``, so
    hidden inputs follow this term's secret), ``setup.sh`` and
    ``run_autograder``. Raises FileExistsError when ``out_dir`` exists and is
    not empty, RegionError for malformed markers.
    """
    kit_root, out_dir = Path(kit_root).resolve(), Path(out_dir).resolve()
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"bundle target {out_dir} is not empty")
    source = out_dir / "source"
    release(kit_root, source, problems)
    for cache in [p for p in source.rglob("*") if p.is_dir() and p.name in LOCAL_CACHES]:
        shutil.rmtree(cache, ignore_errors=True)
    for rel in staff_files(kit_root, problems):
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(kit_root / rel, source / rel)
    if course_secret:
        (source / "grading" / "staff" / SECRET_FILE.name).write_text(course_secret + "\n")
    for name, text in (("setup.sh", SETUP_SH), ("run_autograder", RUN_AUTOGRADER)):
        (source / name).write_text(text)
        (source / name).chmod(0o755)
    archive = out_dir / "autograder.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as bundle:
        for file in sorted(source.rglob("*")):
            if file.is_file():
                info = zipfile.ZipInfo.from_file(file, file.relative_to(source).as_posix())
                info.compress_type = zipfile.ZIP_DEFLATED
                bundle.writestr(info, file.read_bytes())
    return archive


def _fallback(message: str) -> dict:
    return {"score": 0.0, "output": message, "visibility": "visible", "tests": [
        {"name": "grading", "score": 0.0, "max_score": 0.0, "status": "failed", "output": message,
         "visibility": "visible"}]}


def write_placeholder(results: Path) -> None:
    """A results.json saying the grader did not finish (replaced by the real report when it does)."""
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(_fallback("The autograder started but did not finish (killed or out of time). "
                                            "Please tell the course staff."), indent=1) + "\n")


def finalize(results: Path, exit_code: int) -> bool:
    """Keep a valid results.json; otherwise replace it by one explaining ``exit_code``. True when it was valid."""
    try:
        data = json.loads(results.read_text())
        valid = isinstance(data, dict) and isinstance(data.get("tests"), list) and "score" in data
    except (OSError, ValueError):
        valid = False
    if valid and exit_code not in (124, 137):
        return True
    why = {124: "ran out of time (GRADING_TOTAL_TIMEOUT)", 137: "was killed after running out of time"}.get(
        exit_code, f"stopped with exit code {exit_code} without a valid report")
    if valid and data.get("tests"):
        data["output"] = (data.get("output", "") + f"\nThe autograder {why}; this report may be partial.").strip()
        results.write_text(json.dumps(data, indent=1) + "\n")
        return True
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(_fallback(f"The autograder {why}. Please tell the course staff."), indent=1)
                       + "\n")
    return False


def main(argv: list[str]) -> int:
    """``placeholder RESULTS`` or ``finalize RESULTS EXIT_CODE`` (used by run_autograder)."""
    if len(argv) == 2 and argv[0] == "placeholder":
        write_placeholder(Path(argv[1]))
        return 0
    if len(argv) == 3 and argv[0] == "finalize":
        finalize(Path(argv[1]), int(argv[2]))
        return 0
    print("usage: python -m grading.commands.gradescope placeholder RESULTS | finalize RESULTS EXIT_CODE",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    run_and_exit(lambda: main(sys.argv[1:]))
