"""Buggy variants of 4.1 (staff only, never released): each loses exactly the criteria it names and breaks
the clauses it names."""
from __future__ import annotations

from grading.kit.variants import Clause, Variant, edited

DDP = "data_parallel/ddp.py"


def first(line: str, body: str) -> str:
    """``body`` with ``line`` put before it at the body's indentation."""
    return body[:len(body) - len(body.lstrip(" "))] + line + "\n" + body


_LAUNCH = "self._launched.append((dist.all_reduce(buffer, op=dist.ReduceOp.SUM, async_op=True), buffer))"
_ERROR_PATH = """            for handle, _ in self._launched:      # keep the ranks' collectives paired before failing
                handle.wait()
            self._reset()
            raise RuntimeError(message)"""

VARIANTS = [
    Variant("bucket_bytes_or_ed", DDP, "__init__", edited(DDP, "__init__", (
        "if current and size + nbytes > cap:", "if current and size | nbytes > cap:")), frozenset({"4.1.buckets"}),
        breaks=(Clause("404a", "BucketedDDP.buckets", "a bucket's bytes are the sum of its parameters' bytes (a "
                       "cap between a sum and its bitwise or)", "4.1.buckets"),)),
    Variant("frozen_stops_bucketing", DDP, "__init__", edited(DDP, "__init__", (
        "            if not param.requires_grad:\n                continue",
        "            if not param.requires_grad:\n                break")),
        frozenset({"4.1.grads", "4.1.grads_hidden"}),
        breaks=(Clause("405b", "BucketedDDP.buckets", "a frozen parameter is skipped, and the parameters before "
                       "it still bucketed (a frozen parameter in the middle)", "4.1.grads"),)),
    Variant("bucket_bytes_start_at_minus_one", DDP, "__init__", edited(DDP, "__init__", (
        "        size = 0\n", "        size = -1\n")), frozenset({"4.1.buckets"}),
        breaks=(Clause("404d", "BucketedDDP.buckets", "a bucket's bytes start at 0, and again at 0 in each new "
                       "bucket (caps one byte below an exact fit)", "4.1.buckets"),)),
    Variant("next_bucket_bytes_start_at_one", DDP, "__init__", edited(DDP, "__init__", (
        "current, size = [], 0", "current, size = [], 1")), frozenset({"4.1.buckets"}),
        breaks=(Clause("404e", "BucketedDDP.buckets", "... (the second bucket's exact fit)", "4.1.buckets"),)),
    Variant("no_broadcast", DDP, "__init__", edited(DDP, "__init__", (
        """with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)""", "pass")), frozenset({"4.1.broadcast"}),
        breaks=(Clause("401", "BucketedDDP.__init__", "broadcasts every parameter of `module` from rank 0",
                       "4.1.broadcast"),)),
    Variant("params_only_broadcast", DDP, "__init__", edited(DDP, "__init__", (
        "[*module.parameters(), *module.buffers()]", "module.parameters()")), frozenset({"4.1.broadcast"}),
        breaks=(Clause("402", "BucketedDDP.__init__", "... and every buffer", "4.1.broadcast"),)),
    Variant("cap_reached_starts_new_bucket", DDP, "__init__", edited(DDP, "__init__", (
        "size + nbytes > cap", "size + nbytes >= cap")), frozenset({"4.1.buckets", "4.1.buckets_hidden"}),
        hint="likely cause: a bucket that reaches the cap exactly was closed",
        breaks=(
            Clause("404", "BucketedDDP.buckets", "a new bucket only when the bucket's bytes would then exceed "
                   "the cap (an exact fit stays)", "4.1.buckets"),
            Clause("404b", "BucketedDDP.buckets", "the same, on hidden caps that always include an exact fit "
                   "drawn from the secret (3 ranks)", "4.1.buckets_hidden"),
        )),
    Variant("registration_order_buckets", DDP, "__init__", edited(DDP, "__init__", (
        "reversed(list(named.items()))", "list(named.items())")),
        frozenset({"4.1.buckets", "4.1.buckets_hidden", "4.1.overlap"}),   # bucket 0 (fc1) completes last
        hint="likely cause: parameters taken in registration order",
        breaks=(Clause("403", "BucketedDDP.buckets", "trainable parameters in reverse order of "
                       "`named_parameters()`", "4.1.buckets"),)),
    Variant("frozen_in_buckets", DDP, "__init__", edited(DDP, "__init__", (
        """            if not param.requires_grad:
                continue
""", ""), ("self._params = [[named[name] for name in bucket] for bucket in self.buckets]",
           "self._params = [ps for ps in ([named[n] for n in b if named[n].requires_grad] for b in self.buckets) "
           "if ps]"), ("self._arrived = [0] * len(self.buckets)", "self._arrived = [0] * len(self._params)")),
        frozenset({"4.1.buckets", "4.1.buckets_hidden"}), hint="likely cause: a frozen parameter",
        breaks=(Clause("405", "BucketedDDP.buckets", "frozen parameters are in no bucket", "4.1.buckets"),)),
    Variant("per_parameter_all_reduce", DDP, "_grad_ready", edited(DDP, "_grad_ready", (
        """            grads = [p.grad.detach().reshape(-1) for p in self._params[self._next]]
            buffer = torch.cat(grads)
            """ + _LAUNCH, """            for p in self._params[self._next]:
                buffer = p.grad.detach().reshape(-1).clone()
                """ + _LAUNCH)), frozenset({"4.1.one_buffer"}),
        also=((DDP, "finish_gradient_synchronization", edited(DDP, "finish_gradient_synchronization", (
            """        for (handle, buffer), bucket in zip(self._launched, self._params):
            handle.wait()
            buffer /= self.world_size
            offset = 0
            for param in bucket:
                n = param.numel()
                param.grad.copy_(buffer[offset:offset + n].view_as(param.grad))
                offset += n""", """        params = [p for bucket in self._params for p in bucket]
        for (handle, buffer), param in zip(self._launched, params):
            handle.wait()
            param.grad.copy_((buffer / self.world_size).view_as(param.grad))""")),),),
        breaks=(Clause("408", "BucketedDDP hooks", "a bucket's gradients copied into one flat buffer, "
                       "all-reduced once", "4.1.one_buffer"),)),
    Variant("launch_when_complete_any_order", DDP, "_grad_ready", """
        index = self._bucket_of[id(param)]
        self._arrived[index] += 1
        self._seen.add(id(param))
        if self._arrived[index] == len(self._params[index]):
            buffer = torch.cat([p.grad.detach().reshape(-1) for p in self._params[index]])
            self._launched.append((index, dist.all_reduce(buffer, op=dist.ReduceOp.SUM, async_op=True), buffer))
            self._next += 1
    """, frozenset({"4.1.launch_order"}), also=((DDP, "finish_gradient_synchronization", edited(
        DDP, "finish_gradient_synchronization",
        ("for handle, _ in self._launched:", "for _, handle, _ in self._launched:"),
        ("""        for (handle, buffer), bucket in zip(self._launched, self._params):
            handle.wait()""", """        for index, handle, buffer in sorted(self._launched, key=lambda e: e[0]):
            bucket = self._params[index]
            handle.wait()"""))),),
        breaks=(Clause("409", "BucketedDDP hooks", "buckets launch in index order, also when layers run in "
                       "another order than registered (ShuffledNet)", "4.1.launch_order"),)),
    Variant("sum_not_mean", DDP, "finish_gradient_synchronization", edited(DDP, "finish_gradient_synchronization", (
        "            buffer /= self.world_size\n", "")), frozenset({"4.1.grads", "4.1.train", "4.1.grads_hidden"}),
        hint="likely cause: a sum without the division by the world size",
        breaks=(
            Clause("410", "finish_gradient_synchronization", "buffer / world size written back into each `.grad` "
                   "(the mean over ranks)", "4.1.grads"),
            Clause("415", "BucketedDDP", "training through it equals serial training on the global batch (SGD, "
                   "Adam)", "4.1.train"),
        )),
    Variant("launch_in_finish", DDP, "_grad_ready", """
        self._arrived[self._bucket_of[id(param)]] += 1
        self._seen.add(id(param))
    """, frozenset({"4.1.overlap"}), also=((DDP, "finish_gradient_synchronization", """
        missing = [self._names[id(p)] for bucket in self._params for p in bucket if id(p) not in self._seen]
        if missing:
            self._reset()
            raise RuntimeError(f"BucketedDDP: parameters {missing} received no gradient")
        for bucket in self._params:
            buffer = torch.cat([p.grad.detach().reshape(-1) for p in bucket])
            dist.all_reduce(buffer, op=dist.ReduceOp.SUM, async_op=True).wait()
            buffer /= self.world_size
            offset = 0
            for param in bucket:
                n = param.numel()
                param.grad.copy_(buffer[offset:offset + n].view_as(param.grad))
                offset += n
        self._reset()
    """),),
        breaks=(Clause("406", "BucketedDDP hooks", "a bucket launches during backward, as soon as its last "
                       "gradient has arrived", "4.1.overlap"),)),
    Variant("blocking_all_reduce_in_hook", DDP, "_grad_ready", first("import types", edited(DDP, "_grad_ready", (
        _LAUNCH, """dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
            self._launched.append((types.SimpleNamespace(wait=lambda: None), buffer))"""))),
        frozenset({"4.1.overlap"}),
        breaks=(Clause("407", "BucketedDDP hooks", "with `all_reduce(buffer, async_op=True)` (not a blocking "
                       "all-reduce)", "4.1.overlap"),)),
    Variant("state_not_reset", DDP, "_reset", "pass", frozenset({"4.1.reset", "4.1.train", "4.1.after_error"}),
        breaks=(Clause("411", "finish_gradient_synchronization", "resets the per-backward state: the next "
                       "backward starts afresh", "4.1.reset"),),
        # alone: it loses 4.1.reset through the reference finish (a stale buffer divided again in place); a finish
        # rewritten beside it (per_parameter_all_reduce divides a copy) keeps that criterion passing
        alone=True),
    Variant("unused_not_detected", DDP, "finish_gradient_synchronization", edited(
        DDP, "finish_gradient_synchronization", (_ERROR_PATH, "            pass")), frozenset({"4.1.unused_raises"}),
        breaks=(Clause("412", "finish_gradient_synchronization", "RuntimeError when a trainable parameter "
                       "received no gradient", "4.1.unused_raises"),)),
    Variant("names_pending_buckets", DDP, "finish_gradient_synchronization", edited(
        DDP, "finish_gradient_synchronization", (
            "missing = [self._names[id(p)] for bucket in self._params for p in bucket if id(p) not in self._seen]",
            "missing = [name for bucket in self.buckets[self._next:] for name in bucket]")),
        frozenset({"4.1.unused_raises"}),
        breaks=(Clause("413", "finish_gradient_synchronization", "the message names exactly those parameters "
                       "(not the rest of their buckets)", "4.1.unused_raises"),)),
    # a bucket launched when its first gradient arrived, the missing ones sent as zeros (all in order)
    Variant("bucket_launched_before_full", DDP, "_grad_ready", edited(DDP, "_grad_ready", (
        "self._arrived[self._next] == len(self._params[self._next])", "self._arrived[self._next] >= 1"), (
        "[p.grad.detach()", "[(p.grad if p.grad is not None else torch.zeros_like(p)).detach()")),
        frozenset({"4.1.grads", "4.1.grads_hidden", "4.1.train"}),
        hint="likely cause: a bucket was all-reduced before all of its gradients arrived",
        breaks=(Clause("406b", "BucketedDDP hooks", "a bucket launches when its last gradient has arrived, not "
                       "before (the missing gradients are not all-reduced as zeros)", "4.1.grads"),)),
    Variant("raise_without_reset", DDP, "finish_gradient_synchronization", edited(
        DDP, "finish_gradient_synchronization", (_ERROR_PATH, _ERROR_PATH.replace("            self._reset()\n", ""))),
        frozenset({"4.1.after_error"}),
        breaks=(Clause("414", "finish_gradient_synchronization", "it resets the state before raising, so the "
                       "next backward works", "4.1.after_error"),)),
    # reads each bucket's buffer without waiting on its handle: the grader hands an async result to its tensor only
    # at wait(), so this race loses on every run, with its cause named
    Variant("never_waits", DDP, "finish_gradient_synchronization", edited(DDP, "finish_gradient_synchronization", (
        "            handle.wait()\n            buffer /= self.world_size", "            buffer /= self.world_size")),
        frozenset({"4.1.grads", "4.1.grads_hidden", "4.1.train"}), hint="were never waited on (handle.wait())",
        breaks=(Clause("415b", "finish_gradient_synchronization", "waits on every launched handle before it "
                       "reads a buffer (the grader hands an async result to its tensor only at `wait()`: a race "
                       "that loses on every run, its cause named)", "4.1.grads"),),
        alone=True),        # a race: tests/kit/test_races.py grades it (by this name) five times more, on its own
    # ints compared by identity: equal only below 257 (ManyScalarsNet: 257 parameters in one bucket, 257 buckets)
    Variant("bucket_count_compared_with_is", DDP, "_grad_ready", edited(DDP, "_grad_ready", (
        "self._arrived[self._next] == len(self._params[self._next])",
        "self._arrived[self._next] is len(self._params[self._next])")), frozenset({"4.1.grads"}),
        breaks=(Clause("415c", "BucketedDDP hooks", "counts compared with `==`, not identity: 257 one-element "
                       "parameters in one bucket", "4.1.grads"),)),
    Variant("next_bucket_compared_with_is_not", DDP, "_grad_ready", edited(DDP, "_grad_ready", (
        "while self._next < len(self._params)", "while self._next is not len(self._params)")),
        frozenset({"4.1.grads"}),
        breaks=(Clause("415d", "BucketedDDP hooks", "... and one bucket each (257 buckets: the next bucket's "
                       "index passes 256)", "4.1.grads"),)),
    Variant("finish_compares_with_is_not", DDP, "finish_gradient_synchronization", edited(
        DDP, "finish_gradient_synchronization", ("if self._next < len(self._params):",
                                                 "if self._next is not len(self._params):")),
        frozenset({"4.1.grads"}),
        breaks=(Clause("415e", "finish_gradient_synchronization", "... and the check that every bucket launched "
                       "(257 buckets)", "4.1.grads"),)),
]

NOT_GRADED = """
`BucketedDDP.forward` and the ValueError for `bucket_mb` are provided code outside the regions. "A parameter
larger than the cap sits alone" is exercised by 4.1.buckets at a cap of 1e-9 MiB, but no realistic bug breaks only
it. Caller obligations, nothing to grade: `module` on this rank's device, each trainable parameter's hook firing
once per backward (no reentrant activation checkpointing), one backward per `finish_gradient_synchronization`
(gradient accumulation is stated as unsupported), one dtype for all trainable parameters (the buffer's dtype: every
CPU check is fp32). Freedoms: what `BucketedDDP` does when several backward passes run before one
`finish_gradient_synchronization` (gradient accumulation: unsupported, an error or gradients of any kind, and no
check runs it); whether `finish_gradient_synchronization` waits for the buckets already launched before it raises
its RuntimeError (every rank issued them alike and their buffers are dropped: nothing observable on the CPU
grader). Return values: `BucketedDDP.__init__`, the hook `_grad_ready`, `finish_gradient_synchronization` and
`_reset` return None (no caller reads the value: one returned instead changes nothing).
"""
