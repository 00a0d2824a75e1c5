"""Problem 1.1, style b: explicit while loop, one check per line."""
import random

from torch.utils.data import DataLoader

from data_parallel.dataset import DEFAULT_SEED, Partition


def __len__(self):
    # BEGIN_STUDENT 1.1
    count = 0
    for _ in self.index:
        count += 1
    return count
    # END_STUDENT 1.1


def __getitem__(self, i):
    # BEGIN_STUDENT 1.1
    return self.data[self.index[i]]
    # END_STUDENT 1.1


def partition_indices(size, world_size, seed=DEFAULT_SEED):
    # BEGIN_STUDENT 1.1
    if size < 0:
        raise ValueError("size is negative: %d" % size)
    if world_size <= 0:
        raise ValueError("world_size must be positive: %d" % world_size)
    generator = random.Random()
    generator.seed(seed)
    everything = list(range(size))
    generator.shuffle(everything)
    result = []
    position = 0
    r = 0
    while r < world_size:
        take = size // world_size
        if r < size % world_size:
            take += 1
        result.append(everything[position:position + take])
        position = position + take
        r += 1
    return result
    # END_STUDENT 1.1


def partition_dataset(rank, world_size, dataset, batch_size, collate_fn=None, seed=DEFAULT_SEED):
    # BEGIN_STUDENT 1.1
    if rank not in range(world_size):
        raise ValueError("rank %d outside [0, %d)" % (rank, world_size))
    size_here = int(batch_size / world_size)
    if size_here == 0:
        raise ValueError("batch_size %d < world_size %d" % (batch_size, world_size))
    all_parts = partition_indices(len(dataset), world_size, seed=seed)
    local = Partition(dataset, all_parts[rank])
    loader = DataLoader(dataset=local, batch_size=size_here, shuffle=False, collate_fn=collate_fn)
    return loader
    # END_STUDENT 1.1
