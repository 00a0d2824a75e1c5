"""Problem 3.2, style c: one dict comprehension to save; symmetric difference of keys to load."""
import torch

from finetune.lora import ADAPTER_PARAM_NAMES


def save_adapter(model, path):
    # BEGIN_STUDENT 3.2
    def is_adapter(key):
        return key.split(".")[-1] in ADAPTER_PARAM_NAMES

    torch.save({key: value.detach().clone().cpu() for key, value in model.named_parameters() if is_adapter(key)},
               path)
    # END_STUDENT 3.2


def load_adapter(model, path):
    # BEGIN_STUDENT 3.2
    params = {k: v for k, v in model.named_parameters() if k.split(".")[-1] in ADAPTER_PARAM_NAMES}
    data = torch.load(path, weights_only=True, map_location="cpu")
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise ValueError("load_adapter: expected a dict of tensors")
    diff = set(params).symmetric_difference(data)
    if diff:
        raise ValueError(f"load_adapter: keys do not match: {sorted(diff)}")
    wrong = [k for k in params if data[k].size() != params[k].size()]
    if wrong:
        raise ValueError(f"load_adapter: wrong shapes for {wrong}")
    for k in sorted(params):
        params[k].detach().copy_(data[k])
    # END_STUDENT 3.2
