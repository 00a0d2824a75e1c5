"""Problem 2.1, style b: one filtered comprehension per cycle; cut points over a filled device list."""
import torch
from torch import nn

from pipeline.partition import WithDevice, layer_device


def clock_cycles(microbatches, stages):
    # BEGIN_STUDENT 2.1
    if stages < 1:
        raise ValueError("stages must be >= 1")
    if microbatches < 0:
        raise ValueError("microbatches must be >= 0")
    total = microbatches + stages - 1 if microbatches else 0
    for t in range(total):
        yield [(t - s, s) for s in range(stages) if 0 <= t - s < microbatches]
    # END_STUDENT 2.1


def split_module(module):
    # BEGIN_STUDENT 2.1
    resolved = []
    for layer in module.children():
        if isinstance(layer, WithDevice):
            layer.module.to(layer.device)
            resolved.append((layer.module, layer.device))
        else:
            resolved.append((layer, layer_device(layer)))
    if not resolved:
        return [], []
    known = [d for _, d in resolved if d is not None]
    fill = known[0] if known else torch.device("cpu")
    for idx, (layer, dev) in enumerate(resolved):
        if dev is None:
            resolved[idx] = (layer, fill)
        else:
            fill = dev
    cuts = [0] + [k for k in range(1, len(resolved)) if resolved[k][1] != resolved[k - 1][1]] + [len(resolved)]
    stages = [nn.Sequential(*[layer for layer, _ in resolved[a:b]]) for a, b in zip(cuts, cuts[1:])]
    return stages, [resolved[a][1] for a in cuts[:-1]]
    # END_STUDENT 2.1
