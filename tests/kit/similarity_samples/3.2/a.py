"""Problem 3.2, style a: filter the state_dict by suffix; compare key sets as a whole."""
import torch


def save_adapter(model, path):
    # BEGIN_STUDENT 3.2
    out = {}
    for name, tensor in model.state_dict().items():
        if name.endswith(".lora_A") or name.endswith(".lora_B"):
            out[name] = tensor.detach().cpu().clone()
    torch.save(out, path)
    # END_STUDENT 3.2


def load_adapter(model, path):
    # BEGIN_STUDENT 3.2
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(loaded, dict):
        raise ValueError("not an adapter file")
    own = {n: p for n, p in model.named_parameters() if n.endswith((".lora_A", ".lora_B"))}
    if set(loaded) != set(own):
        raise ValueError(f"adapter keys differ: missing {set(own) - set(loaded)}, extra {set(loaded) - set(own)}")
    for n, p in own.items():
        if not torch.is_tensor(loaded[n]) or tuple(loaded[n].shape) != tuple(p.shape):
            raise ValueError(f"{n}: wrong shape")
    with torch.no_grad():
        for n, p in own.items():
            p.data.copy_(loaded[n])
    # END_STUDENT 3.2
