"""The Gradescope autograder bundle: ``python -m grading gradescope OUT_DIR``.

``OUT_DIR/autograder.zip`` is what one uploads; ``OUT_DIR/source/`` is the same tree unpacked (``build_bundle``).
The bundle holds no reference solution, and its ``run_autograder`` always leaves Gradescope a ``results.json``,
even when the grader is killed.
"""
from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

from grading.kit.secret import SECRET_FILE
from grading.commands.release import release, staff_files
from grading.kit.course import DEFAULT_PROBLEMS

LOCAL_CACHES = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".ipynb_checkpoints"}

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope setup: a virtual environment (Ubuntu 24.04's python3 refuses system-wide pip installs, PEP 668)
# with the kit's pinned requirements and the CPU build of torch (the PyPI default wheel pulls in gigabytes
# of CUDA libraries that the grader never uses).
# Overridable (defaults in brackets): GRADING_PYTHON [python3], GRADING_VENV [/autograder/venv],
# GRADING_VENV_OPTIONS [none; e.g. --system-site-packages], GRADING_TORCH_INDEX [the PyTorch CPU index].
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${GRADING_PYTHON:-python3}"
VENV="${GRADING_VENV:-/autograder/venv}"
# The pinned transformers needs Python >= 3.11: Ubuntu 22.04's python3 (3.10) cannot install it.
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "setup.sh: the kit needs Python 3.11 or \
newer, this image has " + sys.version.split()[0] + ": choose the Ubuntu 24.04 base image (Python 3.12)")'
# shellcheck disable=SC2086
"$PYTHON" -m venv ${GRADING_VENV_OPTIONS:-} "$VENV" 2>/dev/null || {
    apt-get update -qq && apt-get install -y -qq python3-venv && "$PYTHON" -m venv ${GRADING_VENV_OPTIONS:-} "$VENV"; }
"$VENV/bin/python" -m pip install --no-cache-dir --upgrade pip
TORCH_INDEX="${GRADING_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
"$VENV/bin/python" -m pip install --no-cache-dir --index-url "$TORCH_INDEX" "$(grep -E '^torch==' requirements.txt)"
"$VENV/bin/python" -m pip install --no-cache-dir -r requirements.txt
"$VENV/bin/python" -c "import torch, transformers, deepspeed; print('torch', torch.__version__)"
# The ranks that run student code switch to this unprivileged user (docs/sandbox.md); the grader stays root.
# Only root may read the grader (source/: the course secret, staff.py, the hidden checks), even where the
# container refuses the namespaces that hide it from the ranks too.
id -u student >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin student
chmod -R go-rwx .
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope entry point: grade the submission into results.json. Always leaves a results.json.
# Overridable (defaults in brackets): AUTOGRADER_ROOT [/autograder], GRADING_SOURCE [$AUTOGRADER_ROOT/source],
# GRADING_SUBMISSION [$AUTOGRADER_ROOT/submission], GRADING_RESULTS [$AUTOGRADER_ROOT/results/results.json],
# GRADING_PYTHON [$AUTOGRADER_ROOT/venv/bin/python, made by setup.sh], GRADING_ARGS [extra arguments for "grade",
# e.g. --problem 1],
# GRADING_TOTAL_TIMEOUT [@TOTAL_TIMEOUT@ seconds for the whole grade, from `gradescope --total_timeout`;
# Gradescope's own limit must be above it], GRADING_FORKSERVERS [1: one fork server, the least memory].
set -u
export GRADING_FORKSERVERS="${GRADING_FORKSERVERS:-1}"
ROOT="${AUTOGRADER_ROOT:-/autograder}"
SOURCE="${GRADING_SOURCE:-$ROOT/source}"
SUBMISSION="${GRADING_SUBMISSION:-$ROOT/submission}"
RESULTS="${GRADING_RESULTS:-$ROOT/results/results.json}"
PYTHON="${GRADING_PYTHON:-$ROOT/venv/bin/python}"
mkdir -p "$(dirname "$RESULTS")"
cd "$SOURCE" || exit 1
LIMIT="${GRADING_TOTAL_TIMEOUT:-@TOTAL_TIMEOUT@}"
"$PYTHON" -m grading.commands.report placeholder "$RESULTS"
started=$SECONDS
# the grade shares LIMIT among its cases and keeps results.json current, so a stop at LIMIT keeps what it judged;
# its stdout (the staff's whole table) is hidden from students by results.json's stdout_visibility
# shellcheck disable=SC2086
timeout --kill-after=30 "$LIMIT" "$PYTHON" -m grading grade "$SUBMISSION" --json "$RESULTS" --quiet \\
    --total-timeout "$LIMIT" ${GRADING_ARGS:-}
code=$?
reached=0
[ $((SECONDS - started)) -ge "$LIMIT" ] && reached="$LIMIT"
"$PYTHON" -m grading.commands.report finalize "$RESULTS" "$code" "$reached"
exit 0
"""


DEFAULT_TOTAL_TIMEOUT_S = 540      # inside Gradescope's default 10-minute limit, with a minute for the rest


def build_bundle(kit_root: Path, out_dir: Path, problems: tuple[str, ...] = DEFAULT_PROBLEMS,
                 course_secret: str = "", total_timeout_s: int = DEFAULT_TOTAL_TIMEOUT_S) -> Path:
    """Write ``out_dir/source/`` and ``out_dir/autograder.zip``; return the zip's path.

    The tree is the student release of ``kit_root`` for ``problems`` (regions
    emptied) plus the staff parts (``grading/staff`` and each chosen folder's
    ``staff.py``: answers and hidden inputs; with ``course_secret`` written to
    ``grading/staff/course_secret.txt``, so
    hidden inputs follow this term's secret), ``setup.sh`` and
    ``run_autograder`` (whose whole grade stops after ``total_timeout_s`` seconds, reported as out of
    time; Gradescope's own limit must be above it). Raises ValueError for a limit below 1 s,
    FileExistsError when ``out_dir`` exists and is not empty, RegionError for malformed markers.
    """
    kit_root, out_dir = Path(kit_root).resolve(), Path(out_dir).resolve()
    if total_timeout_s < 1:
        raise ValueError(f"--total_timeout must be at least 1 second, got {total_timeout_s}")
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
    run_autograder = RUN_AUTOGRADER.replace("@TOTAL_TIMEOUT@", str(int(total_timeout_s)))
    for name, text in (("setup.sh", SETUP_SH), ("run_autograder", run_autograder)):
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
