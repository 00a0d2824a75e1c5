"""``scripts/gpu_check.sh`` on a machine without a GPU: it parses, its commands are valid, every part says SKIP.

What can be checked without CUDA: bash syntax, the total time budget, that
every entry-point command it would run is accepted by that entry point's own
parser (so a GPU session does not lose its minutes to a typo), and the
one-line-per-part report. The parts themselves need a GPU.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from project import run_data_parallel, run_finetune, run_pipeline
from common import ROOT

pytestmark = pytest.mark.kit

SCRIPT = ROOT / "scripts" / "gpu_check.sh"
PARSERS = {"project/run_pipeline.py": run_pipeline, "project/run_data_parallel.py": run_data_parallel,
           "project/run_finetune.py": run_finetune}


def _dry_run(out: Path | None = None) -> list[tuple[str, int, str]]:
    """The parts a dry run lists; with ``out`` as its log folder, which it must leave uncreated."""
    env = {**os.environ, **({"GPU_CHECK_DIR": str(out)} if out else {})}
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert out is None or not out.exists(), "a dry run wrote its log folder"
    parts = [re.fullmatch(r"(\S+) \(timeout (\d+)s\): (.*)", line) for line in done.stdout.splitlines()]
    assert all(parts), done.stdout
    return [(m.group(1), int(m.group(2)), m.group(3)) for m in parts]


def test_script_parses_and_fits_in_eight_minutes(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)], timeout=30).returncode == 0
    parts = _dry_run(tmp_path / "logs")
    assert sum(seconds for _, seconds, _ in parts) <= 8 * 60
    names = [name for name, _, _ in parts]
    assert len(names) == len(set(names)) >= 8


def test_every_entry_point_command_is_accepted_by_its_parser():
    checked = 0
    for name, _, command in _dry_run():
        for piece in command.split("&&"):
            argv = shlex.split(piece)
            if len(argv) > 1 and argv[1] in PARSERS:
                PARSERS[argv[1]].build_parser().parse_args(argv[2:])   # exits 2 on a bad option
                checked += 1
    assert checked >= 7


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the parts run for real (minutes)")
def test_without_a_gpu_every_part_reports_skip_in_one_line(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin:" + str(Path(sys.executable).parent),
                               "GPU_CHECK_DIR": str(tmp_path)})
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr
    assert [line.split()[1].rstrip(":") for line in lines] == [name for name, _, _ in _dry_run()]
    assert all(line.startswith("SKIP ") and "no CUDA device" in line for line in lines)
