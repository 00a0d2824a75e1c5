"""Buggy variants of 4.2 (staff only, never released): each loses exactly the criteria it names and breaks
the clauses it names."""
from __future__ import annotations

from grading.kit.variants import Clause, Variant, edited

ZERO = "data_parallel/zero1.py"

_GATHER = """        shards = [torch.empty_like(self.master) for _ in range(self.world_size)]
            dist.all_gather(shards, self.master.detach())
            full = torch.cat(shards)"""
_SCATTER = """\
            shard_grad = torch.empty(self.shard_numel, dtype=torch.float32, device=device)
            dist.reduce_scatter(shard_grad, list(grads.chunk(self.world_size)), op=dist.ReduceOp.SUM)
            shard_grad /= self.world_size"""

VARIANTS = [
    Variant("no_division_by_world_size", ZERO, "step", edited(ZERO, "step", (
        "            shard_grad /= self.world_size\n", "")), frozenset({"4.2.steps", "4.2.steps_hidden"}),
        hint="likely cause: the reduce-scattered sum was not divided by the world size",
        breaks=(
            Clause("423", "ShardedOptimizer.step", "reduce-scatter (sum) divided by the world size: the shard of "
                   "the mean gradient", "4.2.steps"),
            Clause("424", "ShardedOptimizer.step", "updated shards all-gathered into every parameter: all ranks "
                   "equal serial torch.optim", "4.2.steps"),
        )),
    Variant("no_padding", ZERO, "_flat", """
        return torch.cat([(t if t is not None else torch.zeros_like(p)).reshape(-1).float().to(device)
                          for p, t in zip(self.params, tensors)])
    """, frozenset({"4.2.uneven", "4.2.steps_hidden", "4.2.memory_hidden"}),   # 212 parameters on 3 ranks
        breaks=(Clause("422", "ShardedOptimizer", "padded to N x S; rank r owns `[r S, (r + 1) S)` (P not "
                       "divisible by N)", "4.2.uneven"),)),
    Variant("replicated_optimizer_state", ZERO, "__init__", """
        device = self.params[0].device
        with torch.no_grad():
            self.master = nn.Parameter(self._flat([p.detach() for p in self.params], device))
        self.optimizer = optimizer_cls([self.master], **kwargs)
    """, frozenset({"4.2.memory", "4.2.memory_hidden", "4.2.collectives"}), also=((ZERO, "step", edited(ZERO, "step", (
        """            shard_grad = torch.empty(self.shard_numel, dtype=torch.float32, device=device)
            dist.reduce_scatter(shard_grad, list(grads.chunk(self.world_size)), op=dist.ReduceOp.SUM)
            shard_grad /= self.world_size""", """            dist.all_reduce(grads)
            shard_grad = grads / self.world_size"""), (_GATHER.strip(), "full = self.master.detach()"))),),
        breaks=(
            Clause("420", "ShardedOptimizer", "`master`: a 1-D fp32 shard of S = ceil(P / N); the inner "
                   "optimizer sees only it (12 S bytes for Adam)", "4.2.memory"),
            Clause("424c", "ShardedOptimizer.step", "each `step()` calls these two collectives once each, in "
                   "that order, and no other (recorded per step over the memory run's 5 Adam steps; only calls "
                   "inside `step()` are logged, so the grader's own are not counted)", "4.2.collectives"),
        )),
    Variant("master_in_model_dtype", ZERO, "__init__", edited(ZERO, "__init__", (
        "flat[start:start + self.shard_numel].clone()",
        "flat[start:start + self.shard_numel].to(self.params[0].dtype)")),
        frozenset({"4.2.bf16"}), also=((ZERO, "step", edited(ZERO, "step", (
            "self.master.grad = shard_grad", "self.master.grad = shard_grad.to(self.master.dtype)"))),),
        breaks=(Clause("421", "ShardedOptimizer", "fp32 master shards whatever the model's dtype; parameters "
                       "keep theirs (bf16 model)", "4.2.bf16"),)),
    Variant("none_grads_skipped", ZERO, "_flat", """
        flat = torch.zeros(self.world_size * self.shard_numel, dtype=torch.float32, device=device)
        present = [t.reshape(-1).float() for t in tensors if t is not None]
        joined = torch.cat(present) if present else flat[:0]
        flat[:joined.numel()] = joined
        return flat
    """, frozenset({"4.2.none_grads"}),
        breaks=(Clause("425", "ShardedOptimizer.step", "a grad that is None counts as zeros of its size: the "
                       "parameters after it keep their offsets", "4.2.none_grads"),)),
    Variant("master_grad_kept", ZERO, "step", edited(ZERO, "step", (
        "        self.optimizer.step()\n        self.master.grad = None\n", "        self.optimizer.step()\n")),
        frozenset({"4.2.master_grad_none"}),
        breaks=(Clause("426", "ShardedOptimizer.step", "`master.grad` is set to None afterwards",
                       "4.2.master_grad_none"),)),
    # right values, twice the traffic: the whole flat gradient all-reduced, then this rank's shard sliced out
    Variant("all_reduce_then_slice", ZERO, "step", edited(ZERO, "step", (_SCATTER, """\
            dist.all_reduce(grads, op=dist.ReduceOp.SUM)
            start = self.rank * self.shard_numel
            shard_grad = grads[start:start + self.shard_numel] / self.world_size""")),
        frozenset({"4.2.collectives"}), hint="likely cause: the whole flat gradient was all-reduced",
        breaks=(Clause("423b", "ShardedOptimizer.step", "the padded gradient (N x S elements) is "
                       "reduce-scattered (`reduce_scatter`, or `reduce_scatter_tensor`) into this rank's S "
                       "elements; no all-reduce of the whole gradient (same values, twice the traffic)",
                       "4.2.collectives"),)),
    # right values, twice the traffic: each rank's shard written into zeros, the full vector all-reduced
    Variant("all_gather_by_all_reduce", ZERO, "step", edited(ZERO, "step", (_GATHER.strip(), """\
full = torch.zeros(self.world_size * self.shard_numel, dtype=torch.float32, device=device)
            start = self.rank * self.shard_numel
            full[start:start + self.shard_numel] = self.master.detach()
            dist.all_reduce(full, op=dist.ReduceOp.SUM)""")),
        frozenset({"4.2.collectives"}),
        hint="likely cause: the updated shards were summed into a zero-padded full vector",
        breaks=(Clause("424b", "ShardedOptimizer.step", "the updated shards (S elements each) come back by one "
                       "all-gather (`all_gather`, or `all_gather_into_tensor`) into N x S, after the "
                       "reduce-scatter; not by an all-reduce of a zero-padded full vector", "4.2.collectives"),)),
    # assumes a second trainable parameter: a model with a single one raises IndexError
    Variant("device_of_second_parameter", ZERO, "__init__", edited(ZERO, "__init__", (
        "device = self.params[0].device", "device = self.params[1].device")),
        frozenset({"4.2.steps", "4.2.steps_hidden"}), hint="one trainable tensor",
        breaks=(Clause("420b", "ShardedOptimizer", "a single trainable parameter is enough (`self.params` of one "
                       "entry): one Adam step on a model whose only trainable tensor is a bias-free `Linear(4, "
                       "3)`'s weight equals serial Adam", "4.2.steps"),)),
    # allowed: the flat-tensor forms of the same two collectives (full marks)
    Variant("flat_tensor_collectives", ZERO, "step", edited(ZERO, "step", (
        "dist.reduce_scatter(shard_grad, list(grads.chunk(self.world_size)), op=dist.ReduceOp.SUM)",
        "dist.reduce_scatter_tensor(shard_grad, grads, op=dist.ReduceOp.SUM)"), (_GATHER.strip(), """\
full = torch.empty(self.world_size * self.shard_numel, dtype=torch.float32, device=device)
            dist.all_gather_into_tensor(full, self.master.detach())""")), frozenset()),
]

NOT_GRADED = """
In `ShardedOptimizer` the choice of `self.params`, `numel`, `shard_numel`, its ValueError, `zero_grad`,
`state_bytes`, `state_dict` and `load_state_dict` are provided code outside the regions. Freedoms: the padding's
values in the master shard (they never reach a parameter), the flat-tensor forms of ZeRO-1's two collectives
(`reduce_scatter_tensor` on the flat gradient, `all_gather_into_tensor` into one N x S vector: the full-marks
variant `flat_tensor_collectives`), any communication in `ShardedOptimizer.__init__` (the contract states none;
only `step()`'s collectives are recorded). Return values: `ShardedOptimizer.__init__`/`step` return None (no
caller reads the value: one returned instead changes nothing); `ShardedOptimizer._flat` is a helper only the
student's own regions call, so what it returns is judged through `step`'s results (4.2.steps, 4.2.uneven,
4.2.none_grads). *GPU only* (`scripts/gpu_check.sh`, part `problem4_cuda`): the master shard on the parameters'
CUDA device.
"""
