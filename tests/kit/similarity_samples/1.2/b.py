"""Problem 1.2, style b: one flat buffer, a single all-reduce, copied back by offsets."""
import datetime

import torch
import torch.distributed as dist



def setup_process_group(rank, world_size, backend="gloo", init_method=None, timeout=None):
    # BEGIN_STUDENT 1.2
    import os as _os
    method = init_method
    if method is None:
        _os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        _os.environ.setdefault("MASTER_PORT", "29511")
        method = "env://"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend=backend, init_method=method, world_size=world_size, rank=rank,
                            timeout=timeout if timeout else datetime.timedelta(minutes=1))
    # END_STUDENT 1.2


def average_gradients(model):
    # BEGIN_STUDENT 1.2
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= dist.get_world_size()
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n
    # END_STUDENT 1.2


def train_step(model, optimizer, inputs, targets, loss_fn):
    # BEGIN_STUDENT 1.2
    model.zero_grad()
    out = model(inputs)
    current = loss_fn(out, targets)
    current.backward()
    average_gradients(model)
    optimizer.step()
    return current.detach().item()
    # END_STUDENT 1.2
