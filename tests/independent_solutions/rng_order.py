"""A correct solution that makes, in the student regions, the choices the docstrings leave open differently from
the reference, in particular the order in which the global torch generator is drawn.

- ``apply_lora`` wraps the targets in reverse order (the docstring allows any order): every ``lora_A`` is drawn
  from the global generator, so each adapter starts from other random values than the reference's;
- ``average_gradients`` all-reduces the gradients in reverse parameter order, all in one flat buffer;
- ``Pipe.forward`` binds its tasks with ``functools.partial`` and keeps the outputs in a dict;
- ``gpt2_stages`` builds the stages from the last to the first.
Regions not listed keep the reference's body. ``EDITS`` has the layout of ``docstring_only.EDITS``.
"""
from __future__ import annotations

EDITS: list[tuple[str, str, str]] = [
    ("data_parallel/comm.py", "average_gradients", """
        grads = [p.grad for p in reversed(list(model.parameters())) if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    """),
    ("pipeline/pipe.py", "forward", """
        import functools

        def run(j, xb):
            return self.stages[j](xb.to(self.devices[j]))

        current = dict(enumerate(torch.split(x, self.split_size)))
        for wave in schedule.clock_cycles(len(current), len(self.stages)):
            for i, j in wave:
                self.workers.submit(j, functools.partial(run, j, current[i]))
            for i, j in wave:
                current[i] = self.workers.receive(j)
        return torch.cat([current[i] for i in range(len(current))], dim=0).to(self.devices[-1])
    """),
    ("pipeline/gpt2.py", "gpt2_stages", """
        n, blocks = len(devices), list(model.transformer.h)
        counts = [len(blocks) // n + (1 if k < len(blocks) % n else 0) for k in range(n)]
        starts = [sum(counts[:k]) for k in range(n)]
        stages = []
        for k in reversed(range(n)):
            layers = []
            if k == n - 1:
                layers.append(LMHead(model))
            layers.insert(0, Blocks(blocks[starts[k]:starts[k] + counts[k]], model.config))
            if k == 0:
                layers.insert(0, Embeddings(model))
            stages.insert(0, nn.Sequential(*layers).to(devices[k]))
        return stages
    """),
    ("finetune/lora.py", "apply_lora", """
        names = list(target_names)
        if rank < 1:
            raise ValueError(f"apply_lora: rank must be >= 1, got {rank}")
        if not names or len(set(names)) != len(names) or "" in names:
            raise ValueError(f"apply_lora: target_names must be distinct, non-empty names, got {names}")
        modules = dict(model.named_modules())
        for name in names:
            if name not in modules:
                raise ValueError(f"apply_lora: no module named {name!r}")
            if not isinstance(modules[name], nn.Linear):
                raise ValueError(f"apply_lora: {name!r} is {type(modules[name]).__name__}, not nn.Linear")
        model.requires_grad_(False)
        for name in reversed(names):      # any order: each LoRALinear draws its lora_A now
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, LoRALinear(modules[name], rank, alpha))
        return model
    """),
]
