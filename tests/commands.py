"""Run a kit command (``python -m grading ...``) from a test as ``batch`` runs its grades.

``run_kit_command`` starts it with ``grading.engine.kit_command.start``: forked by the test session's zygotes
(``tests/kit/conftest.py``) unless its ``PYTHON*`` start-up settings differ from this process's, in any folder (a
starter's own ``grading`` in the starter's folder too: the command imports its folder's modules), else as a new
interpreter. Either way it is a process of its own with its argv, folder, environment, stdio and exit code
(``tests/kit/test_zygote.py`` holds the two ways to the same result); tests about a new interpreter as a student
starts one use ``subprocess`` directly (``tests/kit/test_local_grade.py``, one reference grade in
``tests/kit/test_grade_cli.py``).
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from grading import KIT_ROOT
from grading.engine import kit_command


def run_kit_command(args: list[str], cwd: Path = KIT_ROOT, env: dict[str, str] | None = None,
                    timeout: float = 600, module: str = "grading") -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` in ``cwd`` (environment: ``env``, default this process's); its exit code and text
    output as ``subprocess.run(..., capture_output=True, text=True)`` gives them. Raises
    ``subprocess.TimeoutExpired`` (after stopping it) when it runs longer than ``timeout`` seconds."""
    args = [str(arg) for arg in args]
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        process = kit_command.start(module, args, cwd, dict(os.environ if env is None else env),
                                       subprocess.DEVNULL, stdout.fileno(), stderr.fileno())
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
            raise
        texts = []
        for stream in (stdout, stderr):
            stream.seek(0)
            texts.append(stream.read().decode(errors="replace"))
    return subprocess.CompletedProcess(["python", "-m", module, *args], code, *texts)
