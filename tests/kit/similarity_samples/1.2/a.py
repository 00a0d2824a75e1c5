"""Problem 1.2, style a: keyword dict for init, list of gradients, in-place division."""

import torch
import torch.distributed as dist



def setup_process_group(rank, world_size, backend="gloo", init_method=None, timeout=None):
    # BEGIN_STUDENT 1.2
    import os
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    kwargs = {"backend": backend, "rank": rank, "world_size": world_size}
    if init_method is None:
        os.environ["MASTER_ADDR"] = os.environ.get("MASTER_ADDR", "localhost")
        os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT", "12355")
        kwargs["init_method"] = "env://"
    else:
        kwargs["init_method"] = init_method
    if timeout is not None:
        kwargs["timeout"] = timeout
    dist.init_process_group(**kwargs)
    # END_STUDENT 1.2


def average_gradients(model):
    # BEGIN_STUDENT 1.2
    size = float(dist.get_world_size())
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    for g in grads:
        dist.all_reduce(g)
        g.div_(size)
    # END_STUDENT 1.2


def train_step(model, optimizer, inputs, targets, loss_fn):
    # BEGIN_STUDENT 1.2
    optimizer.zero_grad(set_to_none=True)
    predictions = model(inputs)
    loss = loss_fn(predictions, targets)
    loss.backward()
    average_gradients(model)
    optimizer.step()
    return float(loss.detach())
    # END_STUDENT 1.2
