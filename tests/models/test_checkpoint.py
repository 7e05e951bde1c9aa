"""Checkpoint forms: experts fused by transformers >= 5 ([E, 2I, H] or transposed), and load errors."""
from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import save_file

from runtime.models.loader import build_model
from tests.models.conftest import Pair


def _write(pair: Pair, path, transform=lambda name, t: t, drop: str | None = None) -> None:
    """The in-memory (fused-expert) state dict of the HF model as one safetensors file."""
    tensors = {name: transform(name, t).contiguous() for name, t in pair.hf.state_dict().items()
               if name != drop}
    save_file(tensors, str(path / "model.safetensors"))
    shutil.copy(pair.path / "config.json", path / "config.json")


@pytest.mark.parametrize("transposed", [False, True])
def test_fused_expert_checkpoint_loads_the_same_weights(pair: Pair, tmp_path, transposed: bool) -> None:
    if pair.family == "llama":
        pytest.skip("dense model")

    def transform(name: str, tensor: torch.Tensor) -> torch.Tensor:
        fused = name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj")
        return tensor.transpose(1, 2) if transposed and fused else tensor

    if not any(n.endswith("experts.gate_up_proj") for n in pair.hf.state_dict()):
        pytest.skip("this transformers keeps experts per expert in memory (< 5.0)")
    _write(pair, tmp_path, transform)
    fused = build_model(None, torch.float32, "cpu", load_format="safetensors", path=tmp_path)
    ours = dict(pair.ours.named_parameters())
    for name, param in fused.named_parameters():
        assert torch.equal(param, ours[name]), name


def test_missing_tensor_is_an_error(pair: Pair, tmp_path) -> None:
    if pair.family != "deepseek_v3":
        pytest.skip("one family is enough")
    _write(pair, tmp_path, drop="model.layers.1.self_attn.kv_b_proj.weight")
    with pytest.raises(ValueError, match="kv_b_proj"):
        build_model(None, torch.float32, "cpu", load_format="safetensors", path=tmp_path)
