"""Short versions of the runs behind the handout's numbers, on the kit at ``ROOT``: ``python short_runs.py
ROOT WORKDIR`` prints one JSON object of the figures.

Run in a process of its own, because each implementation is a copy of the kit with its own ``project`` and
student packages (``tests/test_reference_numbers.py`` runs it on the reference and on an independent solution).
The runs are the entry points' own ``main``, the handout's commands with 32 examples, one epoch, batches of 16:
- ``run_data_parallel.py --world_size 2`` (Problem 1): each rank's training loss of epoch 0, the validation loss;
- ``run_pipeline.py --model_parallel_mode pipeline_parallel --n_chunk 4`` (Problem 2): the training and validation
  losses (``tests/test_project_runners.py`` checks that ``model_parallel`` prints the same);
- ``run_finetune.py`` (Problem 3, 2 ranks): the validation loss before -> after.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SHORT = ["--n_train", "32", "--n_valid", "8", "--n_epochs", "1", "--quiet"]


def figures(workdir: Path) -> dict[str, float]:
    """Run the three entry points (short) with their outputs under ``workdir``; the numbers the handout states."""
    from project import run_data_parallel, run_finetune, run_pipeline
    from project.launch import start_rank_server
    from project.run_finetune import RANK_IMPORTS

    start_rank_server(2, RANK_IMPORTS)     # one rank server for both 2-rank runs (DeepSpeed imported once)

    def common(name: str) -> list[str]:
        return ["--workdir", str(workdir), "--out_dir", str(workdir / name), *SHORT]

    out: dict[str, float] = {}
    run_data_parallel.main([*common("dp"), "--world_size", "2", "--batch_size", "16"])
    for rank in range(2):
        metrics = json.loads((workdir / "dp" / f"metrics_rank{rank}.json").read_text())
        out[f"dp_rank{rank}_train_loss"] = metrics["epochs"][0]["train_loss"]
    out["dp_val_loss"] = metrics["val_loss_after"]
    m = run_pipeline.main([*common("pp"), "--model_parallel_mode", "pipeline_parallel", "--batch_size", "16",
                           "--n_chunk", "4"])
    out["pp_train_loss"], out["pp_val_loss"] = m["epochs"][0]["train_loss"], m["val_loss_after"]
    s = run_finetune.main([*common("ft"), "--world_size", "2", "--micro_batch", "8"])
    out["ft_val_loss_before"], out["ft_val_loss"] = s["val_loss_before"], s["val_loss_after"]
    return out


if __name__ == "__main__":
    kit, work = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    os.chdir(kit)
    sys.path.insert(0, str(kit))
    print(json.dumps(figures(work)))
