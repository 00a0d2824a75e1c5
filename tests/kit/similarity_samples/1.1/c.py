"""Problem 1.1, style c: table-driven validation and an islice over one iterator."""
import random

from torch.utils.data import DataLoader

from data_parallel.dataset import DEFAULT_SEED, Partition


def __len__(self):
    # BEGIN_STUDENT 1.1
    return self.index.__len__()
    # END_STUDENT 1.1


def __getitem__(self, i):
    # BEGIN_STUDENT 1.1
    item = self.data[self.index[i]]
    return item
    # END_STUDENT 1.1


def partition_indices(size, world_size, seed=DEFAULT_SEED):
    # BEGIN_STUDENT 1.1
    import itertools
    for label, value, low in (("size", size, 0), ("world_size", world_size, 1)):
        if value < low:
            raise ValueError(f"{label} must be at least {low}, got {value}")
    perm = list(range(size))
    random.Random(seed).shuffle(perm)
    it = iter(perm)
    q, rem = divmod(size, world_size)
    return [list(itertools.islice(it, q + 1 if k < rem else q)) for k in range(world_size)]
    # END_STUDENT 1.1


def partition_dataset(rank, world_size, dataset, batch_size, collate_fn=None, seed=DEFAULT_SEED):
    # BEGIN_STUDENT 1.1
    checks = {"rank in range": 0 <= rank < world_size, "positive local batch": batch_size >= world_size}
    failed = [what for what, ok in checks.items() if not ok]
    if failed:
        raise ValueError("partition_dataset: " + ", ".join(failed) + " violated")
    return DataLoader(
        Partition(dataset, partition_indices(len(dataset), world_size, seed)[rank]),
        batch_size=batch_size // world_size,
        collate_fn=collate_fn,
    )
    # END_STUDENT 1.1
