"""Provided LoRA extras: GPT-2 Conv1D conversion and PEFT's on-disk adapter layout, checked against PEFT itself.

These use only provided code (``LoRALinear``, ``finetune.gpt2``, ``finetune.peft_io``), not the student
functions, so they pass in the starter too. PEFT is a test-only dependency, pinned in requirements.txt.
"""
import copy

import pytest
import torch
from torch import nn

from finetune.gpt2 import conv1d_to_linear, lora_target_names
from finetune.lora import LoRALinear
from finetune.peft_io import export_peft_adapter, import_peft_adapter, read_peft_adapter


def _tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=97, n_positions=32, bos_token_id=0,
                        eos_token_id=0)
    return GPT2LMHeadModel(config).eval()


def _wrap(model: nn.Module, names: list[str], rank: int, alpha: float) -> None:
    """LoRA at ``names`` with the provided layer, and random (non-zero) lora_B so the adapters matter."""
    for name in names:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, LoRALinear(model.get_submodule(name), rank, alpha))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("lora_B"):
                param.copy_(0.2 * torch.randn(param.shape, generator=generator))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.encoder = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.encoder(x))


def test_conv1d_to_linear_keeps_gpt2_outputs():
    model = _tiny_gpt2()
    ids = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before = model(ids).logits
    with pytest.raises(ValueError, match="conv1d_to_linear"):
        lora_target_names(model, ("c_attn",))
    converted = conv1d_to_linear(model)
    assert converted == [f"transformer.h.{i}.{part}" for i in range(2)
                         for part in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]
    assert lora_target_names(model, ("c_attn",)) == ["transformer.h.0.attn.c_attn", "transformer.h.1.attn.c_attn"]
    assert isinstance(model.transformer.h[0].attn.c_attn, nn.Linear)
    assert model.transformer.h[0].attn.c_attn.weight.shape == (96, 32)      # (out, in) like nn.Linear
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before, rtol=1e-5, atol=1e-6)


def test_peft_loads_our_gpt2_adapter_with_the_same_outputs(tmp_path):
    import peft
    base = _tiny_gpt2()
    ours = copy.deepcopy(base)
    conv1d_to_linear(ours)
    names = lora_target_names(ours, ("c_attn", "c_fc"))
    _wrap(ours, names, rank=4, alpha=8)
    export_peft_adapter(ours, tmp_path / "adapter", base_model_name_or_path="tiny-gpt2", fan_in_fan_out=True)
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == ["adapter_config.json",
                                                                         "adapter_model.safetensors"]
    theirs = peft.PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "adapter").eval()
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want, got, plain = ours(ids).logits, theirs(ids).logits, base(ids).logits
    assert (want - plain).abs().max() > 1e-3          # the adapter changes the outputs ...
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)   # ... and PEFT reproduces them


def test_adapter_saved_by_peft_imports_with_the_same_outputs(tmp_path):
    import peft
    base = _Net()
    names = ["encoder.0", "encoder.2", "head"]
    theirs = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(r=2, lora_alpha=6, target_modules=names,
                                                                       lora_dropout=0.0))
    with torch.no_grad():
        for name, param in theirs.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.3, generator=torch.Generator().manual_seed(5))
    theirs.save_pretrained(tmp_path / "peft")
    state, config = read_peft_adapter(tmp_path / "peft")
    assert sorted(state) == sorted(f"{n}.{p}" for n in names for p in ("lora_A", "lora_B"))
    assert (config["r"], config["lora_alpha"]) == (2, 6)

    ours = copy.deepcopy(base)
    _wrap(ours, names, rank=2, alpha=6)
    import_peft_adapter(ours, tmp_path / "peft")
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs.eval()(x), rtol=1e-5, atol=1e-6)


def test_import_rejects_a_mismatched_model_before_changing_it(tmp_path):
    source = _Net()
    _wrap(source, ["encoder.0", "head"], rank=2, alpha=4)
    export_peft_adapter(source, tmp_path / "a")
    for names, rank in ((["encoder.0", "head"], 3), (["encoder.0"], 2), (["encoder.0", "encoder.2", "head"], 2)):
        target = _Net()
        _wrap(target, names, rank=rank, alpha=2 * rank)
        before = {n: p.detach().clone() for n, p in target.named_parameters()}
        with pytest.raises(ValueError):
            import_peft_adapter(target, tmp_path / "a")
        assert all(torch.equal(p, before[n]) for n, p in target.named_parameters())


def test_export_needs_lora_layers(tmp_path):
    with pytest.raises(ValueError, match="no LoRALinear"):
        export_peft_adapter(_Net(), tmp_path / "none")
