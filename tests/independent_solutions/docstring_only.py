"""A correct solution of Problems 1-3 written from the docstrings alone, without reading the reference's regions.

Each entry of ``EDITS`` is ``(path, function, body)``: the region that ``function`` names in ``path``
(``grading.commands.variants.find_region``: ``"name"`` or ``"name#k"``) gets ``body``. It exists to check that the
numbers the handout states are met by correct code other than the reference (``tests/test_reference_numbers.py``).
"""
from __future__ import annotations

EDITS: list[tuple[str, str, str]] = [
    ("data_parallel/dataset.py", "__len__", """
        return len(self.index)
    """),
    ("data_parallel/dataset.py", "__getitem__", """
        position = self.index[i]
        return self.data[position]
    """),
    ("data_parallel/dataset.py", "partition_indices", """
        if size < 0:
            raise ValueError(f"partition_indices: size must be >= 0, got {size}")
        if world_size < 1:
            raise ValueError(f"partition_indices: world_size must be >= 1, got {world_size}")
        order = list(range(size))
        random.Random(seed).shuffle(order)
        base, extra = divmod(size, world_size)
        parts, start = [], 0
        for r in range(world_size):
            length = base + (1 if r < extra else 0)
            parts.append(order[start:start + length])
            start += length
        return parts
    """),
    ("data_parallel/dataset.py", "partition_dataset", """
        if not 0 <= rank < world_size:
            raise ValueError(f"partition_dataset: rank {rank} is not in [0, {world_size})")
        local_batch = batch_size // world_size
        if local_batch < 1:
            raise ValueError(f"partition_dataset: batch size {batch_size} over {world_size} ranks is 0 per rank")
        part = Partition(dataset, partition_indices(len(dataset), world_size, seed)[rank])
        return DataLoader(part, batch_size=local_batch, shuffle=False, collate_fn=collate_fn)
    """),
    ("data_parallel/comm.py", "setup_process_group", """
        if init_method is None:
            import os
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29500")
            init_method = "env://"
        if timeout is None:
            timeout = datetime.timedelta(seconds=60)
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend=backend, init_method=init_method, rank=rank, world_size=world_size,
                                timeout=timeout)
    """),
    ("data_parallel/comm.py", "average_gradients", """
        world = dist.get_world_size()
        for param in model.parameters():
            if param.grad is None:
                continue
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad /= world
    """),
    ("data_parallel/comm.py", "train_step", """
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        average_gradients(model)
        optimizer.step()
        return float(loss.detach().item())
    """),
    ("pipeline/schedule.py", "clock_cycles", """
        if microbatches < 0:
            raise ValueError(f"clock_cycles: microbatches must be >= 0, got {microbatches}")
        if stages < 1:
            raise ValueError(f"clock_cycles: stages must be >= 1, got {stages}")
        cycles = []
        if microbatches == 0:
            return cycles
        for k in range(microbatches + stages - 1):
            cycles.append([(k - j, j) for j in range(stages) if 0 <= k - j < microbatches])
        return cycles
    """),
    ("pipeline/partition.py", "split_module", """
        partitions: list[nn.Sequential] = []
        devices: list[torch.device] = []
        current: list[nn.Module] = []
        current_device: torch.device | None = None
        pending: list[nn.Module] = []      # parameterless children before the first device
        for child in module.children():
            if isinstance(child, WithDevice):
                device = child.device
                layer = child.module.to(device)
            else:
                device = layer_device(child)
                layer = child
            if device is None:
                (current if current_device is not None else pending).append(layer)
                continue
            if current_device is None:
                current, current_device = pending + [layer], device
                pending = []
            elif device != current_device:
                partitions.append(nn.Sequential(*current))
                devices.append(current_device)
                current, current_device = [layer], device
            else:
                current.append(layer)
        if current_device is None:
            if pending:
                return [nn.Sequential(*pending)], [_CPU]
            return [], []
        partitions.append(nn.Sequential(*current))
        devices.append(current_device)
        return partitions, devices
    """),
    ("pipeline/pipe.py", "forward", """
        chunks = list(torch.split(x, self.split_size))
        outputs = list(chunks)
        n = len(self.stages)

        def task(i, j, inp):
            stage, device = self.stages[j], self.devices[j]
            return lambda: stage(inp.to(device))

        for cycle in schedule.clock_cycles(len(chunks), n):
            for i, j in cycle:
                self.workers.submit(j, task(i, j, outputs[i]))
            for i, j in cycle:
                outputs[i] = self.workers.receive(j)
        return torch.cat(outputs, dim=0)
    """),
    ("pipeline/gpt2.py", "forward", """
        if len(self.blocks) == 0:
            return hidden_states
        mask = causal_mask(self.config, hidden_states)
        for block in self.blocks:
            out = block(hidden_states, attention_mask=mask)
            hidden_states = out[0] if isinstance(out, tuple) else out
        return hidden_states
    """),
    ("pipeline/gpt2.py", "gpt2_stages", """
        n = len(devices)
        blocks = list(model.transformer.h)
        share, extra = divmod(len(blocks), n)
        stages: list[nn.Sequential] = []
        start = 0
        for k, device in enumerate(devices):
            count = share + (1 if k < extra else 0)
            parts: list[nn.Module] = []
            if k == 0:
                parts.append(Embeddings(model))
            parts.append(Blocks(blocks[start:start + count], model.config))
            start += count
            if k == n - 1:
                parts.append(LMHead(model))
            stages.append(nn.Sequential(*parts).to(device))
        return stages
    """),
    ("finetune/lora.py", "apply_lora", """
        names = list(target_names)
        if rank < 1:
            raise ValueError(f"apply_lora: rank must be >= 1, got {rank}")
        if not names:
            raise ValueError("apply_lora: no target names given")
        if len(set(names)) != len(names):
            raise ValueError(f"apply_lora: a target name is given twice in {names}")
        modules = dict(model.named_modules())
        for name in names:
            if name == "":
                raise ValueError("apply_lora: the model itself ('') cannot be a target")
            if name not in modules:
                raise ValueError(f"apply_lora: no module named {name!r}")
            if not isinstance(modules[name], nn.Linear):
                raise ValueError(f"apply_lora: {name!r} is a {type(modules[name]).__name__}, not an nn.Linear")
        for param in model.parameters():
            param.requires_grad_(False)
        for name in names:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            setattr(parent, child, LoRALinear(modules[name], rank, alpha))
        return model
    """),
    ("finetune/lora.py", "save_adapter", """
        state = {name: param.detach().to("cpu").clone()
                 for name, param in model.named_parameters()
                 if name.rpartition(".")[2] in ADAPTER_PARAM_NAMES}
        torch.save(state, path)
    """),
    ("finetune/lora.py", "load_adapter", """
        loaded = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(loaded, dict):
            raise ValueError(f"load_adapter: {path} holds a {type(loaded).__name__}, not a dict of tensors")
        if not loaded:
            raise ValueError(f"load_adapter: {path} holds no tensors")
        for key, value in loaded.items():
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"load_adapter: entry {key!r} is a {type(value).__name__}, not a tensor")
        wanted = {name: param for name, param in model.named_parameters()
                  if name.rpartition(".")[2] in ADAPTER_PARAM_NAMES}
        missing = [name for name in wanted if name not in loaded]
        extra = [key for key in loaded if key not in wanted]
        if missing:
            raise ValueError(f"load_adapter: missing adapter keys {missing}")
        if extra:
            raise ValueError(f"load_adapter: unexpected keys {extra}")
        for name, param in wanted.items():
            if tuple(loaded[name].shape) != tuple(param.shape):
                raise ValueError(f"load_adapter: {name} has shape {tuple(loaded[name].shape)}, "
                                 f"expected {tuple(param.shape)}")
        with torch.no_grad():
            for name, param in wanted.items():
                param.copy_(loaded[name].to(device=param.device, dtype=param.dtype))
    """),
    ("finetune/zero.py", "build_config", """
        for label, value in (("world_size", world_size), ("micro_batch", micro_batch), ("grad_accum", grad_accum)):
            if type(value) is not int or value < 1:
                raise ValueError(f"build_config: {label} must be an int >= 1, got {value!r}")
        if precision not in PRECISIONS:
            raise ValueError(f"build_config: unknown precision {precision!r}; expected one of {PRECISIONS}")
        return {
            "train_batch_size": world_size * micro_batch * grad_accum,
            "train_micro_batch_size_per_gpu": micro_batch,
            "gradient_accumulation_steps": grad_accum,
            "zero_optimization": {"stage": 2},
            "gradient_clipping": 0.0,
            "zero_allow_untested_optimizer": True,
            "fp16": {"enabled": precision == "fp16"},
            "bf16": {"enabled": precision == "bf16"},
        }
    """),
    ("finetune/zero.py", "train_microbatch", """
        outputs = engine(inputs)
        loss = loss_fn(outputs, targets)
        engine.backward(loss)
        engine.step()
        return loss.detach().item()
    """),
]
