"""Ranks that part ways, for tests/kit/test_peers.py (run inside rank processes, over gloo)."""
import torch
import torch.distributed as dist


def _forward(x):
    dist.all_reduce(x)
    return x


def _backward(x):
    dist.all_reduce(x)
    return x


def skips_forward_all_reduce(ctx):
    """Rank 1 skips the first of two all-reduces of the same shape (made from two functions)."""
    def step():
        x = torch.ones(4)
        if ctx.rank == 0:
            _forward(x)
        return _backward(x).tolist()
    ctx.record("grads", step)


def _train_step(x):
    dist.all_reduce(x)
    dist.all_reduce(x * 2)
    return x.sum().item()


def skips_a_step(ctx):
    """Rank 1 makes two steps of two all-reduces each where rank 0 makes three."""
    def train():
        return [_train_step(torch.ones(3)) for _ in range(3 if ctx.rank == 0 else 2)]
    ctx.record("losses", train)


def recv_recv(ctx):
    """Both ranks receive from each other first: neither sends."""
    def exchange():
        x = torch.zeros(2)
        dist.recv(x, src=1 - ctx.rank)
        dist.send(x, dst=1 - ctx.rank)
        return x.tolist()
    ctx.record("exchange", exchange)


def rank1_crashes(ctx):
    """Rank 1 dies (os._exit) while rank 0 waits in an all-reduce; then rank 0 records a second part."""
    import os

    def first():
        if ctx.rank == 1:
            os._exit(3)
        x = torch.ones(2)
        dist.all_reduce(x)
        return x.tolist()
    ctx.record("first", first)
    ctx.record("second", lambda: _train_step(torch.ones(2)))


def probe_fails(ctx):
    """The grader's own code fails before it records 'grads' (a bug in a probe, not in the student's code)."""
    settings = dict(ctx.args)
    inputs = settings["missing_setting"]
    ctx.record("grads", lambda: sum(inputs))


def wrong_world_size(ctx):
    """A group joined with world_size 1 on every rank: rank 1 is not below it."""
    import datetime

    def join():
        dist.init_process_group("gloo", init_method=f"file://{ctx.store}.own", rank=ctx.rank, world_size=1,
                                timeout=datetime.timedelta(seconds=10))
        return True
    ctx.record("joined", join)


def multi_line_error(ctx):
    """all_reduce of a list: torch's TypeError runs over two lines."""
    ctx.record("reduced", lambda: dist.all_reduce([torch.ones(2)]))


def rank1_not_implemented_rank0_cut_off(ctx):
    """Rank 1 records its own NotImplementedError and finishes; rank 0 then fails with what a rank sees when its
    peer left during the group's set-up (gloo's words), before recording: the starter's race under load."""
    import time

    if ctx.rank == 1:
        def grads():
            raise NotImplementedError("Problem 1.2: setup_process_group is not implemented yet")
        ctx.record("grads", grads)
        return
    time.sleep(0.5)
    raise RuntimeError("Gloo connectFullMesh failed with Connection closed by peer [127.0.0.1]:1")
