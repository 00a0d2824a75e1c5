"""Problem 1.1, style a: cumulative offsets with itertools.accumulate."""
import random

from torch.utils.data import DataLoader

from data_parallel.dataset import DEFAULT_SEED, Partition


def __len__(self):
    # BEGIN_STUDENT 1.1
    return len(self.index)
    # END_STUDENT 1.1


def __getitem__(self, i):
    # BEGIN_STUDENT 1.1
    position = self.index[i]
    return self.data[position]
    # END_STUDENT 1.1


def partition_indices(size, world_size, seed=DEFAULT_SEED):
    # BEGIN_STUDENT 1.1
    import itertools
    if world_size < 1 or size < 0:
        raise ValueError("need size >= 0 and world_size >= 1")
    rng = random.Random(seed)
    shuffled = list(range(size))
    rng.shuffle(shuffled)
    lengths = [size // world_size + (r < size % world_size) for r in range(world_size)]
    bounds = [0, *itertools.accumulate(lengths)]
    return [shuffled[lo:hi] for lo, hi in zip(bounds, bounds[1:])]
    # END_STUDENT 1.1


def partition_dataset(rank, world_size, dataset, batch_size, collate_fn=None, seed=DEFAULT_SEED):
    # BEGIN_STUDENT 1.1
    if rank < 0 or rank >= world_size:
        raise ValueError(f"bad rank {rank}")
    per_rank = batch_size // world_size
    if not per_rank:
        raise ValueError("the batch is too small to split")
    mine = partition_indices(len(dataset), world_size, seed)[rank]
    return DataLoader(Partition(dataset, mine), per_rank, collate_fn=collate_fn)
    # END_STUDENT 1.1
