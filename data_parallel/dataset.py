"""Problem 1.1: split a dataset across data-parallel ranks.

Every rank must compute the *same* partition without talking to the others, so
the shuffle is driven by a private, seeded random generator. The exact result
for ``size=10, world_size=3`` and the default seed (1234)::

    shuffled:  [2, 8, 3, 5, 6, 4, 9, 0, 1, 7]     (random.Random(1234).shuffle of list(range(10)))
    rank 0:    [2, 8, 3, 5]        (10 // 3 + 1, because 0 < 10 % 3)
    rank 1:    [6, 4, 9]
    rank 2:    [0, 1, 7]
"""
from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from torch.utils.data import DataLoader, Dataset

DEFAULT_SEED = 1234


class Partition(Dataset):
    """A read-only view of ``data`` restricted to ``index`` (a list of positions).

    ``len(p) == len(index)`` and ``p[i] == data[index[i]]``.
    """

    def __init__(self, data: Sequence[Any], index: list[int]):
        self.data = data
        self.index = list(index)

    def __len__(self) -> int:
        """The number of chosen indices."""
        # BEGIN_STUDENT 1.1
        return len(self.index)
        # END_STUDENT 1.1

    def __getitem__(self, i: int) -> Any:
        """The ``i``-th chosen item: ``data[index[i]]``."""
        # BEGIN_STUDENT 1.1
        return self.data[self.index[i]]
        # END_STUDENT 1.1


def partition_indices(size: int, world_size: int, seed: int = DEFAULT_SEED) -> list[list[int]]:
    """Shuffle ``range(size)`` deterministically and split it into ``world_size`` parts.

    Contract:
    - shuffle ``list(range(size))`` in place with ``random.Random(seed).shuffle``
      (one call, nothing else drawn); never use the global ``random`` module
      (its state must be unchanged afterwards);
    - cut the shuffled list into contiguous slices in rank order: part 0 is
      its first slice, part 1 the next one, and so on (see the picture);
    - part ``r`` gets ``size // world_size`` indices, plus one more when
      ``r < size % world_size``; parts may be empty (``size < world_size``),
      and ``size == 0`` gives ``world_size`` empty parts;
    - every index appears in exactly one part;
    - the same arguments give the same parts in every process.

    Raises ValueError when ``size < 0`` or ``world_size < 1``.
    Returns a list of ``world_size`` lists of ints.
    """
    # BEGIN_STUDENT 1.1
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    order = list(range(size))
    random.Random(seed).shuffle(order)
    base, extra = divmod(size, world_size)
    parts, start = [], 0
    for rank in range(world_size):
        length = base + (1 if rank < extra else 0)
        parts.append(order[start:start + length])
        start += length
    return parts
    # END_STUDENT 1.1


def partition_dataset(rank: int, world_size: int, dataset: Sequence[Any], batch_size: int,
                      collate_fn: Callable | None = None, seed: int = DEFAULT_SEED) -> DataLoader:
    """Return the DataLoader over rank ``rank``'s part of ``dataset``.

    ``batch_size`` is the *global* batch size: each rank loads
    ``batch_size // world_size`` examples per step, so one step over all ranks
    sees the global batch (when ``batch_size`` is not divisible by
    ``world_size`` the remainder is dropped: 10 over 3 ranks loads 3 per rank;
    the entry points refuse such sizes up front). The part is ``Partition(dataset,
    partition_indices(len(dataset), world_size, seed)[rank])`` (``seed``
    passed on as given), iterated in order (``shuffle=False``) with the given
    ``collate_fn``. Every item of the part is loaded once per epoch: when the
    part's length is not a multiple of the per-rank batch size, its last
    batch is smaller and is still yielded (``drop_last=False``, the
    DataLoader's default).

    Raises ValueError when ``rank`` is not in ``[0, world_size)`` or the
    per-rank batch size would be 0 (a per-rank batch of 1, ``batch_size ==
    world_size``, is fine). Returns a ``torch.utils.data.DataLoader``
    (not a list of its batches).
    """
    # BEGIN_STUDENT 1.1
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    local_batch = batch_size // world_size
    if local_batch < 1:
        raise ValueError(f"batch_size {batch_size} gives no examples per rank for world_size {world_size}")
    part = Partition(dataset, partition_indices(len(dataset), world_size, seed)[rank])
    return DataLoader(part, batch_size=local_batch, shuffle=False, collate_fn=collate_fn)
    # END_STUDENT 1.1
