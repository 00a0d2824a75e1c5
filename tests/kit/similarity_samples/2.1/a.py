"""Problem 2.1, style a: nested loops building each wave; devices resolved first, then grouped."""
from torch import nn

from pipeline.partition import _CPU, WithDevice, layer_device


def clock_cycles(microbatches, stages):
    # BEGIN_STUDENT 2.1
    if microbatches < 0 or stages < 1:
        raise ValueError(f"invalid schedule: {microbatches} micro-batches, {stages} stages")
    if microbatches == 0:
        return
    for clock in range(microbatches + stages - 1):
        wave = []
        for j in range(stages):
            i = clock - j
            if 0 <= i < microbatches:
                wave.append((i, j))
        yield wave
    # END_STUDENT 2.1


def split_module(module):
    # BEGIN_STUDENT 2.1
    assigned = []
    for child in module.children():
        if isinstance(child, WithDevice):
            target = child.device
            child = child.module.to(target)
        else:
            target = layer_device(child)
        assigned.append((child, target))
    # leading children without parameters borrow the first real device
    current = next((d for _, d in assigned if d is not None), _CPU)
    partitions, devices = [], []
    for child, target in assigned:
        target = current if target is None else target
        if not devices or devices[-1] != target:
            partitions.append([])
            devices.append(target)
        partitions[-1].append(child)
        current = target
    return [nn.Sequential(*group) for group in partitions], devices
    # END_STUDENT 2.1
