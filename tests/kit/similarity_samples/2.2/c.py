"""Problem 2.2, style c: a closure factory; each wave's results gathered in a list first."""
import torch

from pipeline import schedule


def forward(self, x):
    # BEGIN_STUDENT 2.2
    def make(stage_no, batch):
        device = self.devices[stage_no]
        module = self.stages[stage_no]
        return lambda: module(batch.to(device))

    micro = [t for t in x.split(self.split_size)]
    cycles = list(schedule.clock_cycles(len(micro), len(self.stages)))
    for step in cycles:
        for i, j in step:
            self.workers.submit(j, make(j, micro[i]))
        results = [self.workers.receive(j) for _, j in step]
        for (i, _), value in zip(step, results):
            micro[i] = value
    out = torch.cat(micro)
    return out.to(self.devices[-1])
    # END_STUDENT 2.2
