"""Problem 2.1: cut an ``nn.Sequential`` into per-device pipeline stages.

A stage is a run of consecutive layers that live on the same device::

    nn.Sequential(Linear@cuda:0, ReLU, Linear@cuda:0, Linear@cuda:1, WithDevice(Dropout, "cuda:1"))
      -> partitions [Sequential(Linear, ReLU, Linear), Sequential(Linear, Dropout)]
         devices    [cuda:0, cuda:1]

``WithDevice`` names the device of a layer explicitly (useful for layers
without parameters, which otherwise just join the stage before them).
"""
from __future__ import annotations

import torch
from torch import nn

_CPU = torch.device("cpu")


class WithDevice(nn.Module):
    """Mark ``module`` as belonging to ``device`` when a Sequential is split.

    ``split_module`` moves the wrapped module to ``device`` and puts the
    unwrapped module into that device's stage. Calling a ``WithDevice``
    directly just calls the wrapped module.
    """

    def __init__(self, module: nn.Module, device: torch.device | str):
        super().__init__()
        self.module = module
        self.device = torch.device(device)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def layer_device(layer: nn.Module) -> torch.device | None:
    """The one device holding all of ``layer``'s parameters, or None when it has none.

    Raises ValueError when the parameters span more than one device.
    """
    devices = {p.device for p in layer.parameters()}
    if len(devices) > 1:
        names = ", ".join(sorted(str(d) for d in devices))
        raise ValueError(f"layer {type(layer).__name__} has parameters on several devices ({names}); "
                         "a pipeline stage must live on one device")
    return devices.pop() if devices else None


def split_module(module: nn.Sequential) -> tuple[list[nn.Sequential], list[torch.device]]:
    """Group the children of ``module`` into stages of consecutive layers on one device.

    A child's device is
    - ``w.device`` for a ``WithDevice`` ``w`` (move ``w.module`` there with
      ``.to(device)`` and put ``w.module``, not ``w``, into the stage);
    - otherwise the device of its parameters (``layer_device`` helps);
    - a child without parameters (e.g. ``ReLU``) has no device of its own and
      joins the current stage; leading parameterless children join the first
      stage. Only parameters count: buffers give a child no device (a
      ``BatchNorm1d(n, affine=False)``, buffers but no parameters, joins the
      current stage like ``ReLU`` and is not moved).
    A new stage starts whenever the device differs from the current stage's.
    When no child has a device at all, everything is one stage on CPU; an
    empty Sequential gives ``([], [])``.

    Raises ValueError when one child's parameters span several devices (the
    message names the layer's class, e.g. ``Linear``, and its devices). Returns ``(partitions, devices)``: a list of
    ``nn.Sequential`` (the original child modules, in order) and a list of
    the ``torch.device`` of each, of equal length; two neighbouring stages
    never share a device.
    """
    # BEGIN_STUDENT 2.1
    groups: list[list[nn.Module]] = []
    devices: list[torch.device] = []
    pending: list[nn.Module] = []           # parameterless layers before the first device
    for layer in module.children():
        if isinstance(layer, WithDevice):
            device, layer = layer.device, layer.module.to(layer.device)
        else:
            device = layer_device(layer)
        if device is None and groups:
            groups[-1].append(layer)
        elif device is None:
            pending.append(layer)
        elif devices and devices[-1] == device:
            groups[-1].append(layer)
        else:
            groups.append(pending + [layer])
            devices.append(device)
            pending = []
    if pending:
        groups.append(pending)
        devices.append(_CPU)
    return [nn.Sequential(*group) for group in groups], devices
    # END_STUDENT 2.1
