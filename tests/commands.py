"""Run a kit command (``python -m grading ...``) from a test as a process of its own, as ``batch`` runs its grades.

A process of its own with its own argv, folder, environment, stdio and exit code; in another folder (a starter)
it imports that folder's ``grading``. A ``grade`` has the session's fork servers (``tests/conftest.py``) fork
the grade itself, as each grade of a ``batch`` has the batch's.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from common import ROOT


def run_kit_command(args: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None,
                    timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m grading ARGS`` in ``cwd`` (environment: ``env``, default this process's); its exit code and text
    output as ``subprocess.run(..., capture_output=True, text=True)`` gives them. Raises
    ``subprocess.TimeoutExpired`` (after stopping it) when it runs longer than ``timeout`` seconds."""
    return subprocess.run([sys.executable, "-m", "grading", *map(str, args)], cwd=cwd,
                          env=dict(os.environ if env is None else env), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)
