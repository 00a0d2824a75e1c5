"""Problem 2.1, style c: explicit index bounds per cycle; itertools.groupby over effective devices."""

import torch
from torch import nn

from pipeline.partition import WithDevice, layer_device


def clock_cycles(microbatches, stages):
    # BEGIN_STUDENT 2.1
    if not (isinstance(stages, int) and stages >= 1):
        raise ValueError(f"clock_cycles: need at least one stage, got {stages!r}")
    if microbatches < 0:
        raise ValueError(f"clock_cycles: negative micro-batch count {microbatches}")
    k = 0
    last = microbatches + stages - 2
    while microbatches and k <= last:
        lo = max(0, k - (microbatches - 1))
        hi = min(stages - 1, k)
        yield list(zip(range(k - lo, k - hi - 1, -1), range(lo, hi + 1)))
        k += 1
    # END_STUDENT 2.1


def split_module(module):
    # BEGIN_STUDENT 2.1
    import itertools
    def device_of(child):
        if isinstance(child, WithDevice):
            return child.module.to(child.device), child.device
        return child, layer_device(child)

    pairs = [device_of(child) for child in module.children()]
    effective = []
    previous = None
    for _, device in pairs:
        previous = device if device is not None else previous
        effective.append(previous)
    upcoming = next((d for d in effective if d is not None), torch.device("cpu"))
    effective = [upcoming if d is None else d for d in effective]
    runs = itertools.groupby(zip((layer for layer, _ in pairs), effective), key=lambda item: item[1])
    result = [(nn.Sequential(*(layer for layer, _ in run)), dev) for dev, run in runs]
    return [seq for seq, _ in result], [dev for _, dev in result]
    # END_STUDENT 2.1
