"""Problem 5.1 probe helpers: what each rank records (``checks.py`` declares the case and judges).

Every part depends on the group the layers split over, so each is recorded
once per split (the helpers run inside ``PROBLEM.each_split``, which names the
parts); a rank outside the split's group records nothing for it. The layer
parts run after the grader's stand-ins replace the student's region functions
(``checks.SWAPS``). Some parts only public criteria read (the region
functions' memory, the shards' copies, dtype/device and bias-free layers).
"""
from __future__ import annotations

import inspect
from contextlib import contextmanager
from typing import Iterator

from grading.check import describe_kind
from grading.problems.probe_helpers import call_outcome
from grading.problems.p5_1_layers import reference as ref

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "broadcast", "reduce", "all_to_all", "all_to_all_single", "gather", "scatter")
P_GROUP = "group_ranks"
P_REGION_FUNCTIONS = "region_functions"
P_REGION_MEMORY = "region_memory"
P_MLP_COMM = "mlp_comm"
P_OUT = {"column": "column_out", "row": "row_out"}
P_GRADS = {"column": "column_grads", "row": "row_grads"}
P_CHUNKS = "column_chunks"
P_SHARD_COPIES = "shard_copies"
P_SHARD_TENSORS = "shard_tensors"
P_NO_BIAS = "no_bias"
P_UNEVEN = "uneven"
P_BAD_CHUNKS = "bad_chunks"
SPLIT_PARTS = (P_GROUP, P_REGION_FUNCTIONS, P_REGION_MEMORY, P_MLP_COMM, *P_OUT.values(), *P_GRADS.values(), P_CHUNKS,
               P_SHARD_COPIES, P_SHARD_TENSORS, P_NO_BIAS, P_UNEVEN, P_BAD_CHUNKS)    # all: each depends on the group
SHARD_KINDS = ("column", "column_chunks3", "row")     # the layers the shard parts build
BAD_CHUNKS = (0, -1)


def uneven_sizes(world_size: int) -> dict[str, int]:
    """Feature counts that do not split over ``world_size`` ranks (column, column with 3 chunks, row)."""
    return {"column": 2 * world_size + 1, "column_chunks3": 3 * (2 * world_size + 1), "row": 2 * world_size + 1}


class Collectives:
    """torch.distributed's collectives, wrapped before the student module binds any: every call is counted by
    name (``counts``), and inside ``splitting_over(members)`` a call on other ranks than ``members`` (no
    ``group``, or another one) is refused at once with a RuntimeError that says so. The ranks outside the
    split's group never join such a call: it would only end at the collective timeout, costing the student
    most of a minute and a message about a timeout instead of the cause."""

    def __init__(self, dist):
        self.counts = {name: 0 for name in COLLECTIVES}
        self.members: list[int] | None = None
        self._dist = dist
        for name in COLLECTIVES:
            real = getattr(dist, name, None)
            if real is not None:
                setattr(dist, name, self._wrap(name, real))

    @contextmanager
    def splitting_over(self, members: list[int]) -> Iterator[None]:
        """Inside: a collective must run on exactly the ranks ``members`` (global ranks)."""
        self.members = sorted(members)
        try:
            yield
        finally:
            self.members = None

    def _wrap(self, name: str, real):
        signature = inspect.signature(real)

        def watched(*args, **kwargs):
            self.counts[name] += 1
            ranks = self._ranks(signature, args, kwargs) if self.members is not None else None
            if ranks is not None and ranks != self.members:
                raise RuntimeError(f"dist.{name} was called on the ranks {ranks} (no group, or another one), but "
                                   f"the layer was given the group of the ranks {self.members}: the ranks outside "
                                   "it never join the call, so it would wait until the collective timeout")
            return real(*args, **kwargs)
        return watched

    def _ranks(self, signature: inspect.Signature, args: tuple, kwargs: dict) -> list[int] | None:
        """The global ranks a call would run on (None: arguments the real call will refuse itself)."""
        try:
            group = signature.bind_partial(*args, **kwargs).arguments.get("group")
            return sorted(self._dist.get_process_group_ranks(group if group is not None else self._dist.group.WORLD))
        except Exception:  # noqa: BLE001 - a malformed call: the real collective raises its own error
            return None


def built(layer, cls: type):
    """``layer``, when ``from_linear`` returned what its contract says (an instance of ``cls``, made by
    ``cls(weight, bias, group)``); otherwise a TypeError naming what came back."""
    if not isinstance(layer, cls):
        raise TypeError(f"{cls.__name__}.from_linear returned {describe_kind(layer)}, expected a {cls.__name__} "
                        "(cls(weight, bias, group))")
    return layer


def forwarded(out, cls: type, shape: str):
    """``out``, when a layer's forward returned a tensor as its contract says; otherwise a TypeError naming what
    came back (its shape is judged against the full layer's output)."""
    import torch

    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{cls.__name__}.forward returned {describe_kind(out)}, expected a tensor {shape}")
    return out


def join_group(ctx, group_ranks: tuple[int, ...]) -> tuple[object, list[int]]:
    """``(group, members)``: the default group (``group_ranks`` empty), or a subgroup of ``group_ranks``.

    Every rank must call it (creating a group is collective), inside
    ``PROBLEM.each_split``. Rank 0 records the members (split part
    ``P_GROUP``), so the criteria know which ranks hold results and each
    one's rank in the group (its index in ``members``).
    """
    import torch.distributed as dist

    members = list(group_ranks) if group_ranks else list(range(ctx.world_size))
    group = dist.new_group(members) if group_ranks else None
    if ctx.rank == 0:
        ctx.record(P_GROUP, lambda: members)
    return group, members


def record_own_functions(ctx, layers, counts: dict, group, rank: int) -> None:
    """The student's region functions alone, and the collectives of the student's column -> row MLP."""
    import torch
    import torch.nn.functional as F

    scale = float(rank + 1)

    def region_functions():
        out = {}
        for name, fn, label in (("copy", layers.copy_to_parallel_region, "CopyToParallelRegion.forward"),
                                ("reduce", layers.reduce_from_parallel_region, "ReduceFromParallelRegion.forward")):
            x = (ref.data("x", ref.IN_FEATURES) * scale).requires_grad_()
            y = fn(x, group)
            if not isinstance(y, torch.Tensor):
                raise TypeError(f"{label} returned {describe_kind(y)}, expected a tensor")
            y.backward(ref.data("g_mlp", ref.IN_FEATURES) * (scale + 1))
            out[name] = {"out": y.detach(), "input_grad": x.grad, "x_unchanged": bool(
                torch.equal(x.detach(), ref.data("x", ref.IN_FEATURES) * scale))}
        return out
    ctx.record(P_REGION_FUNCTIONS, region_functions)

    def region_memory():
        """Does f's forward share the input's memory, and does f's backward leave the caller's gradient alone?"""
        x = (ref.data("x", ref.IN_FEATURES) * scale).requires_grad_()
        y = layers.copy_to_parallel_region(x, group)
        upstream = ref.data("g_mlp", ref.IN_FEATURES) * (scale + 1)
        y.backward(upstream)            # autograd hands this very tensor to the backward
        return {"forward_shares_input": bool(y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()),
                "upstream_unchanged": bool(torch.equal(upstream, ref.data("g_mlp", ref.IN_FEATURES) * (scale + 1)))}
    ctx.record(P_REGION_MEMORY, region_memory)

    def mlp_comm():
        column = built(layers.ColumnParallelLinear.from_linear(ref.column_linear(), group), layers.ColumnParallelLinear)
        row = built(layers.RowParallelLinear.from_linear(ref.row_linear(), group), layers.RowParallelLinear)
        x = ref.data("x", ref.IN_FEATURES).requires_grad_()
        before = dict(counts)
        out = forwarded(row(F.gelu(forwarded(column(x), type(column), "(..., out/N)"))), type(row), "(..., out)")
        forward = {k: counts[k] - before[k] for k in counts if counts[k] != before[k]}
        before = dict(counts)
        (out * ref.data("g_row", ref.OUT_FEATURES)).sum().backward()
        backward = {k: counts[k] - before[k] for k in counts if counts[k] != before[k]}
        return {"forward": forward, "backward": backward}
    ctx.record(P_MLP_COMM, mlp_comm)


def record_layers(ctx, layers, group, rank: int, world: int) -> None:
    """Column/row outputs and gradients (on the grader's region functions), and the uneven-split refusals."""
    def run_layer(kind: str) -> tuple:
        """Build the layer and run its forward: (layer, input, output); kept for the backward part."""
        if kind == "column":
            cls, shape = layers.ColumnParallelLinear, "(..., out/N)"
            layer = built(cls.from_linear(ref.column_linear(), group), cls)
            x = ref.data("x", ref.IN_FEATURES).requires_grad_()
        else:
            cls, shape = layers.RowParallelLinear, "(..., out)"
            layer = built(cls.from_linear(ref.row_linear(), group), cls)
            x = ref.rank_slice(ref.data("h", ref.HIDDEN), rank, world).clone().requires_grad_()
        state[kind] = (layer, x, forwarded(layer(x), cls, shape))
        return state[kind]

    def backward(kind: str) -> dict:
        layer, x, out = state[kind] if kind in state else run_layer(kind)   # re-raises the forward's error
        upstream = (ref.rank_slice(ref.data("g_col", ref.HIDDEN), rank, world) if kind == "column"
                    else ref.data("g_row", ref.OUT_FEATURES))
        (out * upstream).sum().backward()
        return {"weight": layer.weight.grad, "bias": layer.bias.grad, "input": x.grad}

    state: dict = {}
    for kind in ("column", "row"):     # output and gradients recorded apart: a backward bug costs only gradients
        ctx.record(P_OUT[kind], lambda kind=kind: run_layer(kind)[2].detach())
        ctx.record(P_GRADS[kind], lambda kind=kind: backward(kind))

    def uneven():
        sizes = uneven_sizes(world)

        def outcome(fn) -> str:
            return call_outcome(fn, message=True)
        return {
            "even": outcome(lambda: [layers.ColumnParallelLinear.from_linear(ref.column_linear(), group),
                                     layers.ColumnParallelLinear.from_linear(ref.make_linear(4, 6 * world, 1), group,
                                                                             chunks=3),
                                     layers.RowParallelLinear.from_linear(ref.row_linear(), group)]),
            "column": outcome(lambda: layers.ColumnParallelLinear.from_linear(
                ref.make_linear(4, sizes["column"], 1), group)),
            "column_chunks3": outcome(lambda: layers.ColumnParallelLinear.from_linear(
                ref.make_linear(4, sizes["column_chunks3"], 1), group, chunks=3)),
            "row": outcome(lambda: layers.RowParallelLinear.from_linear(ref.make_linear(sizes["row"], 4, 1), group)),
        }
    ctx.record(P_UNEVEN, uneven)
    ctx.record(P_BAD_CHUNKS, lambda: {chunks: call_outcome(
        lambda: layers.ColumnParallelLinear.from_linear(ref.column_linear(), group, chunks=chunks), message=True)
        for chunks in BAD_CHUNKS})


def record_shards(ctx, layers, group, world: int, chunks: int) -> None:
    """The chunked column layout, whether shards are copies, their dtype/device/trainability, layers without bias."""
    ctx.record(P_CHUNKS, lambda: _chunked_layer(layers, group, world, chunks))
    ctx.record(P_SHARD_COPIES, lambda: _shard_copies(layers, group, world))
    ctx.record(P_SHARD_TENSORS, lambda: _shard_tensors(layers, group, world))
    ctx.record(P_NO_BIAS, lambda: _no_bias_outputs(layers, group, world))


def _chunked_layer(layers, group, world: int, chunks: int) -> dict:
    """A column layer of ``chunks`` chunks: its weight and bias shards, and its output."""
    layer = built(layers.ColumnParallelLinear.from_linear(ref.chunked_linear(chunks, world), group, chunks=chunks),
                  layers.ColumnParallelLinear)
    return {"weight": layer.weight.detach().clone(), "bias": layer.bias.detach().clone(),
            "out": forwarded(layer(ref.data("x", ref.IN_FEATURES)), type(layer), "(..., out/N)").detach()}


def _source_linear(kind: str, world: int, bias: bool = True):
    """The full nn.Linear a shard layer of ``kind`` (one of SHARD_KINDS) is built from."""
    if kind == "row":
        return ref.make_linear(ref.HIDDEN, ref.OUT_FEATURES, seed=12, bias=bias)
    return ref.make_linear(ref.IN_FEATURES, 6 * world if kind == "column_chunks3" else ref.HIDDEN, 11, bias=bias)


def _build_layer(layers, group, kind: str, linear):
    """The student's layer of ``kind`` (one of SHARD_KINDS) built by ``from_linear`` from ``linear``."""
    if kind == "row":
        return built(layers.RowParallelLinear.from_linear(linear, group), layers.RowParallelLinear)
    chunks = 3 if kind == "column_chunks3" else 1
    return built(layers.ColumnParallelLinear.from_linear(linear, group, chunks=chunks), layers.ColumnParallelLinear)


def _shard_copies(layers, group, world: int) -> dict:
    """For each of SHARD_KINDS: the source's entries that ``from_linear`` changed, and those an in-place change of
    the shards changed."""
    import torch

    out = {}
    for kind in SHARD_KINDS:
        linear = _source_linear(kind, world)
        before = {name: value.clone() for name, value in linear.state_dict().items()}
        layer = _build_layer(layers, group, kind, linear)
        built = [name for name, value in linear.state_dict().items() if not torch.equal(value, before[name])]
        with torch.no_grad():           # change the shard in place, then look at the source
            for param in (layer.weight, layer.bias):
                param.add_(1.0)
        mutated = [name for name, value in linear.state_dict().items() if not torch.equal(value, before[name])]
        out[kind] = {"changed_by_from_linear": built, "changed_by_shard_update": mutated}
    return out


def _described_shards(layers, group, world: int, kind: str, prepare) -> list[str]:
    """The dtype, device, requires_grad and leaf-ness of the weight and bias of a layer of ``kind`` built from a
    source changed by ``prepare``."""
    layer = _build_layer(layers, group, kind, prepare(_source_linear(kind, world)))
    return [f"{p.dtype}, {p.device.type}, requires_grad={p.requires_grad}, leaf={p.is_leaf}"
            for p in (layer.weight, layer.bias)]


def _shard_tensors(layers, group, world: int) -> dict:
    """For each of SHARD_KINDS: ``_described_shards`` from a float64, a meta and a frozen source (or the error)."""
    out = {}
    for kind in SHARD_KINDS:
        out[kind] = {what: _described_or_error(lambda prepare=prepare: _described_shards(layers, group, world, kind,
                                                                                         prepare))
                     for what, prepare in (("float64", lambda lin: lin.double()),
                                           ("meta", lambda lin: lin.to("meta")),
                                           ("frozen", lambda lin: lin.requires_grad_(False)))}
    return out


def _no_bias_outputs(layers, group, world: int) -> dict:
    """Each layer built without bias, and with a zero bias (same weight): the outputs must be equal."""
    import torch

    out = {}
    for kind in SHARD_KINDS:
        x = (ref.rank_slice(ref.data("h", ref.HIDDEN), dist_rank(group), world) if kind == "row"
             else ref.data("x", ref.IN_FEATURES))
        zero_bias = _source_linear(kind, world, bias=True)
        with torch.no_grad():
            zero_bias.bias.zero_()
        layer = _build_layer(layers, group, kind, _source_linear(kind, world, bias=False))
        shape = "(..., out)" if kind == "row" else "(..., out/N)"
        out[kind] = {"bias_is_none": layer.bias is None, "out": forwarded(layer(x), type(layer), shape).detach(),
                     "zero_bias_out": _build_layer(layers, group, kind, zero_bias)(x).detach()}
    return out


def dist_rank(group) -> int:
    """This process's rank in ``group``."""
    import torch.distributed as dist

    return dist.get_rank(group)


def _described_or_error(fn) -> list[str] | str:
    """``fn()``, or the error it raised as 'Type: message' (kept for the criterion's report)."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a submission may raise anything
        return f"{type(exc).__name__}: {exc}"[:300]
