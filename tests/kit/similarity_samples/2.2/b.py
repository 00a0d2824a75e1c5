"""Problem 2.2, style b: functools.partial binds the module, device and tensor; results in a dict."""

import torch

from pipeline import schedule


def forward(self, x):
    # BEGIN_STUDENT 2.2
    import functools
    def apply(module, device, tensor):
        return module(tensor.to(device))

    pieces = dict(enumerate(torch.split(x, self.split_size)))
    for wave in schedule.clock_cycles(len(pieces), len(self.stages)):
        for micro, s in wave:
            self.workers.submit(s, functools.partial(apply, self.stages[s], self.devices[s], pieces[micro]))
        pieces.update({micro: self.workers.receive(s) for micro, s in wave})
    return torch.cat([pieces[k] for k in sorted(pieces)]).to(self.devices[-1])
    # END_STUDENT 2.2
