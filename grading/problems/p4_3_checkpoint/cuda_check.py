"""Problem 4 on a GPU (``scripts/gpu_check.sh``, part problem4_cuda): what a CPU grader cannot see.

One rank, NCCL, a file store: ``ShardedOptimizer`` keeps its master shard on the
parameters' CUDA device and steps there; ``save_sharded`` writes model.pt with
CPU tensors of a CUDA model; ``load_sharded`` puts the values back on the
model's and the optimizer's CUDA devices. Runs the kit's own code (the
reference on the staff side); prints PASS or raises.

    python -m grading.problems.p4_3_checkpoint.cuda_check
"""
from __future__ import annotations

import datetime
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from grading.problems.p4_1_ddp import reference as ref

SIZES = (8, 16, 4)


def main() -> None:
    """Run the CUDA checks of 4.2 and 4.3 on cuda:0; raise AssertionError naming what is wrong."""
    from data_parallel.checkpoint import load_sharded, save_sharded
    from data_parallel.zero1 import ShardedOptimizer

    folder = Path(tempfile.mkdtemp(prefix="p4_cuda_"))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{folder / 'store'}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        model = ref.ZeroNet(SIZES, seed=0).cuda()
        optimizer = ShardedOptimizer(model.parameters(), torch.optim.Adam, lr=ref.ADAM_LR)
        assert optimizer.master.device.type == "cuda", f"4.2: master shard on {optimizer.master.device}, not cuda"
        x, y = ref.batch(0, SIZES[0], SIZES[-1])
        ref.loss_fn(model(x.cuda()), y.cuda()).backward()
        optimizer.step()
        assert optimizer.master.grad is None and all(p.is_cuda for p in model.parameters()), "4.2: step on cuda"
        save_sharded(folder / "ckpt", 1, model, optimizer, extra={"position": 1})
        state = torch.load(folder / "ckpt" / "model.pt", weights_only=True)     # tensors where they were saved
        on = sorted({str(t.device) for t in state.values()})
        assert on == ["cpu"], f"4.3: model.pt of a CUDA model holds tensors on {on}, expected the CPU only"
        fresh = ref.ZeroNet(SIZES, seed=7).cuda()
        restored = ShardedOptimizer(fresh.parameters(), torch.optim.Adam, lr=ref.ADAM_LR)
        step, extra = load_sharded(folder / "ckpt", fresh, restored)
        assert (step, extra) == (1, {"position": 1}), f"4.3: load_sharded returned {(step, extra)}"
        for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
            assert b.is_cuda and torch.equal(a, b.to(a.device)), f"4.3: '{name}' after load_sharded on {b.device}"
        assert restored.master.is_cuda and torch.equal(restored.master, optimizer.master), "4.3: master shard"
        ref.loss_fn(fresh(x.cuda()), y.cuda()).backward()
        restored.step()                              # the loaded Adam state must sit on cuda to step
        print("PASS problem 4 on cuda: master shard, model.pt on the CPU, load back onto cuda, a step after it")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
