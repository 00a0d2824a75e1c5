"""The numbers the handout states are met by correct code in general, not by the reference alone (issue 61, item 4).

The handout's figures come from the full default runs (minutes each). Here the same entry points run short
(``tests/independent_solutions/short_runs.py``: 32 examples, one epoch) on the reference and on a solution
written from the docstrings alone (``tests/independent_solutions/docstring_only.py``), each spliced into its own
copy of the kit, and each figure must land in the range below. The ranges are set the way the handout's are
(``docs/design.md``, "Measurements behind the defaults"): every correct implementation meets them, on any number
of torch threads per rank. Why they are ranges, as in the handout:
- Problems 1 and 2: every correct code computes the same sums in the same order (a sum over two ranks is exact in
  either order, and dividing by 2 is exact), so the implementations agree to the last bit; the width covers the
  last digits that the CPU's matrix kernels and the number of threads move;
- Problem 3: each ``LoRALinear`` draws its ``lora_A`` from the global generator and ``apply_lora`` may wrap its
  targets in any order, so the adapters start from other random values (the short run's widest spread).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common import ROOT
from tests.independent_solutions import IMPLEMENTATIONS

pytestmark = pytest.mark.project

SHORT_RUNS = Path(__file__).resolve().parent / "independent_solutions" / "short_runs.py"
RUN_TIMEOUT_S = 300

# figure -> (low, high) of the short runs; the fine-tuned loss moves with the order apply_lora wraps its targets in
SHORT_RANGES = {
    "dp_rank0_train_loss": (6.204, 6.209),      # epoch 0 of run_data_parallel.py --world_size 2, per rank
    "dp_rank1_train_loss": (6.204, 6.209),
    "dp_val_loss": (5.898, 5.908),
    "pp_train_loss": (6.204, 6.209),      # run_pipeline.py, pipeline_parallel, --n_chunk 4
    "pp_val_loss": (5.915, 5.925),
    "ft_val_loss_before": (6.3655, 6.3661),      # the random base, before any adapter trains
    "ft_val_loss": (6.17, 6.22),                # see above
}


def _kit(name: str, tmp: Path) -> Path:
    """The kit with ``name``'s region bodies spliced in (the reference: the kit itself)."""
    if name == "reference":
        return ROOT
    from grading.kit.variants import make_variant_kit

    return make_variant_kit(tmp / name, IMPLEMENTATIONS[name])


@pytest.mark.parametrize("name", ["reference", "docstring_only"])
def test_short_runs_land_in_the_stated_ranges(name, tmp_path):
    if name == "reference":            # the kit this process imports: its runs here, no second interpreter
        from tests.independent_solutions.short_runs import figures

        got = figures(tmp_path / "work")
    else:
        kit = _kit(name, tmp_path)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
        done = subprocess.run([sys.executable, str(SHORT_RUNS), str(kit), str(tmp_path / "work")], cwd=kit, env=env,
                              capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert done.returncode == 0, done.stderr[-3000:]
        got = json.loads(done.stdout.strip().splitlines()[-1])
    outside = {k: (round(got[k], 4), SHORT_RANGES[k]) for k in SHORT_RANGES
               if not SHORT_RANGES[k][0] <= got[k] <= SHORT_RANGES[k][1]}
    assert not outside, f"{name}: figures outside their stated range (value, range): {outside}"
