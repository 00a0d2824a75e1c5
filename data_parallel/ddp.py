"""Problem 4.1: DistributedDataParallel by hand, with bucketed all-reduce overlapped with backward.

Problem 1's ``average_gradients`` waits for the whole backward pass, then
all-reduces one parameter at a time. ``BucketedDDP`` groups the gradients into
buckets (last layers first, because backward produces their gradients first)
and starts the all-reduce of a bucket the moment its last gradient is ready,
while backward still computes the earlier layers::

    backward:   grad p5  grad p4 | grad p3  grad p2 | grad p1  grad p0 |
    all-reduce:                  [ bucket 0 ------ ][ bucket 1 ------- ][ bucket 2 ]
                                                                         ^ finish_gradient_synchronization waits

Usage (every rank)::

    ddp = BucketedDDP(model, bucket_mb=25)
    loss = loss_fn(ddp(inputs), targets)
    loss.backward()                            # buckets launch during backward
    ddp.finish_gradient_synchronization()      # every .grad is now the mean over ranks
    optimizer.step()
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

MIB = 2 ** 20


class BucketedDDP(nn.Module):
    """Data-parallel wrapper: bucketed, asynchronous gradient all-reduce overlapped with backward.

    Contract (``module`` is on this rank's device; the default process group exists):

    - **Construction** broadcasts every parameter and every buffer of
      ``module`` from rank 0 (in place, ``torch.distributed.broadcast``), so
      all ranks start from rank 0's weights.
    - **Buckets**: the trainable parameters (``requires_grad``), taken in
      *reverse* order of ``module.named_parameters()``, are cut into
      consecutive buckets. A parameter joins the current bucket unless the
      bucket is non-empty and its bytes (``numel * element_size``, summed)
      would then exceed ``bucket_mb * 2**20``; then it starts a new bucket. A
      parameter larger than the cap sits alone in its bucket. ``self.buckets``
      is the result: a list of buckets, each a list of parameter names (as
      ``named_parameters`` spells them), bucket 0 first. Frozen parameters are
      in no bucket and never synchronised.
    - **Hooks**: one ``register_post_accumulate_grad_hook`` per trainable
      parameter. When the last gradient of a bucket has arrived, the bucket
      is launched: its gradients are copied into one flat buffer (the
      parameters' dtype; all trainable parameters share one dtype) and that
      buffer is all-reduced (sum) with one
      ``torch.distributed.all_reduce(buffer, async_op=True)``, during
      backward. Buckets are launched in index order (bucket i never before
      bucket i - 1), also when the model computes its layers in another order
      than it registers them, so every rank issues the same collectives in
      the same order. A trainable parameter's gradient is accumulated, so
      its hook fires, exactly once per backward (true of every model that
      runs no reentrant activation checkpointing; what the wrapper does
      when a hook fires more often is free).
    - ``finish_gradient_synchronization()``, called once after every
      backward, waits for every launched handle (an async all-reduce's
      buffer holds the sum only once its handle's ``wait()`` has returned;
      before that it may hold anything), writes buffer / world size
      back into each parameter's ``.grad``, and resets the per-backward state
      so the next backward starts afresh. Exactly one backward pass runs
      between two calls: gradient accumulation (several backward passes
      before one call) is not supported, and what the wrapper does then (an
      error, or gradients of any kind) is free; no check runs it. When some
      trainable parameter received no gradient in this backward (its bucket
      can never launch; every trainable parameter must be used, as in torch
      DDP without ``find_unused_parameters``), it resets the state too, so
      the next backward works, and raises RuntimeError whose message names
      exactly those parameters (as ``named_parameters`` spells them).
      Whether it first waits for the buckets already launched is free (every
      rank issued them alike, and their buffers are dropped; waiting is the
      tidy choice).
    - ``forward(*args, **kwargs)`` returns ``module(*args, **kwargs)``.

    Raises ValueError when ``bucket_mb`` is not positive.
    """

    def __init__(self, module: nn.Module, bucket_mb: float = 25.0):
        super().__init__()
        if not bucket_mb > 0:
            raise ValueError(f"bucket_mb must be positive, got {bucket_mb}")
        self.module = module
        self.bucket_mb = float(bucket_mb)
        self.buckets: list[list[str]] = []
        # Hints: keep per-backward state here, e.g. how many gradients of each bucket have arrived,
        # the index of the next bucket to launch, and the (handle, buffer) of each launched bucket.
        # BEGIN_STUDENT 4.1
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)
        named = dict(module.named_parameters())
        cap = self.bucket_mb * MIB
        current: list[str] = []
        size = 0
        for name, param in reversed(list(named.items())):
            if not param.requires_grad:
                continue
            nbytes = param.numel() * param.element_size()
            if current and size + nbytes > cap:
                self.buckets.append(current)
                current, size = [], 0
            current.append(name)
            size += nbytes
        if current:
            self.buckets.append(current)
        self._params = [[named[name] for name in bucket] for bucket in self.buckets]
        self._bucket_of = {id(param): index for index, bucket in enumerate(self._params) for param in bucket}
        self._names = {id(param): name for name, param in named.items()}
        self._arrived = [0] * len(self.buckets)
        self._seen: set[int] = set()
        self._next = 0
        self._launched: list[tuple[Any, torch.Tensor]] = []
        for bucket in self._params:
            for param in bucket:
                param.register_post_accumulate_grad_hook(self._grad_ready)
        # END_STUDENT 4.1

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module: ``module(*args, **kwargs)``."""
        return self.module(*args, **kwargs)

    def _grad_ready(self, param: nn.Parameter) -> None:
        """Post-accumulate-grad hook of ``param``: count it; launch every bucket that is complete, in order."""
        # Hint: a bucket is complete when all its parameters have reported; launch bucket self._next
        # (and the following complete ones) with dist.all_reduce(..., async_op=True).
        # BEGIN_STUDENT 4.1
        self._arrived[self._bucket_of[id(param)]] += 1
        self._seen.add(id(param))
        while self._next < len(self._params) and self._arrived[self._next] == len(self._params[self._next]):
            grads = [p.grad.detach().reshape(-1) for p in self._params[self._next]]
            buffer = torch.cat(grads)
            self._launched.append((dist.all_reduce(buffer, op=dist.ReduceOp.SUM, async_op=True), buffer))
            self._next += 1
        # END_STUDENT 4.1

    def finish_gradient_synchronization(self) -> None:
        """Wait for every bucket's all-reduce, store the mean over ranks in each ``.grad``, reset the state.

        Resets the state and raises RuntimeError naming exactly the trainable
        parameters that got no gradient in this backward (their bucket could not launch).
        """
        # BEGIN_STUDENT 4.1
        if self._next < len(self._params):
            missing = [self._names[id(p)] for bucket in self._params for p in bucket if id(p) not in self._seen]
            message = (f"BucketedDDP: trainable parameters {missing} received no gradient in this backward "
                       f"(bucket {self._next} could not launch); every trainable parameter must get a gradient")
            for handle, _ in self._launched:      # keep the ranks' collectives paired before failing
                handle.wait()
            self._reset()
            raise RuntimeError(message)
        for (handle, buffer), bucket in zip(self._launched, self._params):
            handle.wait()
            buffer /= self.world_size
            offset = 0
            for param in bucket:
                n = param.numel()
                param.grad.copy_(buffer[offset:offset + n].view_as(param.grad))
                offset += n
        self._reset()
        # END_STUDENT 4.1

    def _reset(self) -> None:
        """Forget this backward's arrivals and launches (the next backward starts from bucket 0)."""
        # BEGIN_STUDENT 4.1
        self._arrived = [0] * len(self._params)
        self._seen = set()
        self._next = 0
        self._launched = []
        # END_STUDENT 4.1
