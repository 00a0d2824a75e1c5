"""Two ranks on your own machine: start 2 processes, join one process group, all-reduce a tensor (gloo, CPU).

    python scripts/two_ranks.py                                     # file:// rendezvous, 2 processes
    torchrun --standalone --nproc_per_node 2 scripts/two_ranks.py   # env:// rendezvous (torchrun's)
    python scripts/two_ranks.py --hang                              # rank 1 skips the all_reduce: a
                                                                     # stack dump, then a timeout

Plain torch.distributed, for the handout's primer: not part of the project's library (whose one launcher
is project/launch.py) and not a student function.

Each rank prints ``rank R of 2: all_reduce gave 3`` (1 + 2, summed over the ranks).
"""
import datetime
import faulthandler
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank: int, world_size: int, init_method: str, hang: bool) -> None:
    """One rank: join the group, all-reduce (sum) a tensor holding rank + 1, print the result, leave."""
    faulthandler.dump_traceback_later(5 if hang else 60)      # print this rank's stack if it is still running then
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=10))       # a collective waits at most this long
    value = torch.tensor([rank + 1.0])
    if hang and rank == 1:
        time.sleep(15)                                        # rank 1 never calls all_reduce: rank 0 waits for it
    else:
        dist.all_reduce(value)                                # every rank ends with the sum
        # one write, newline included: the two ranks share stdout, and lines written in parts can interleave
        print(f"rank {rank} of {dist.get_world_size()}: all_reduce gave {value.item():g}\n", end="", flush=True)
    faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()


if __name__ == "__main__":
    hang = "--hang" in sys.argv[1:]
    if "RANK" in os.environ:                                              # started by torchrun: env://
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://", hang)
    else:                                                                 # a fresh file both ranks open
        rendezvous = os.path.join(tempfile.mkdtemp(), "rendezvous")
        mp.spawn(run, args=(2, f"file://{rendezvous}", hang), nprocs=2)
