"""Problem 3.2, style b: walk LoRALinear modules; gather every error before raising."""
import os

import torch

from finetune.lora import ADAPTER_PARAM_NAMES, LoRALinear


def save_adapter(model, path):
    # BEGIN_STUDENT 3.2
    adapter = dict()
    for module_name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            for leaf in ADAPTER_PARAM_NAMES:
                adapter[f"{module_name}.{leaf}"] = getattr(module, leaf).detach().to("cpu").clone()
    torch.save(adapter, os.fspath(path))
    # END_STUDENT 3.2


def load_adapter(model, path):
    # BEGIN_STUDENT 3.2
    try:
        blob = torch.load(os.fspath(path), weights_only=True, map_location=torch.device("cpu"))
    except Exception as err:
        raise ValueError(f"cannot read adapter {path}: {err}") from err
    expected = {}
    for module_name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            for leaf in ADAPTER_PARAM_NAMES:
                expected[f"{module_name}.{leaf}"] = getattr(module, leaf)
    errors = []
    if not isinstance(blob, dict):
        errors.append("file is not a dict")
    else:
        errors += [f"missing {k}" for k in expected if k not in blob]
        errors += [f"unexpected {k}" for k in blob if k not in expected]
        errors += [f"shape of {k}" for k in expected
                   if k in blob and getattr(blob[k], "shape", None) != expected[k].shape]
    if errors:
        raise ValueError("load_adapter: " + ", ".join(errors))
    for k, param in expected.items():
        with torch.no_grad():
            param.copy_(blob[k].to(param.device, param.dtype))
    # END_STUDENT 3.2
