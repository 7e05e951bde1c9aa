"""The single entry point `build_model`: config dict -> model on device with dummy (seeded random)
or local safetensors weights (single file or sharded index, HF names)."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from runtime.distributed.sharding import SINGLE, ModelParallel, shard_spec
from runtime.models.base import CausalLM
from runtime.models.config import ModelConfig
from runtime.models.deepseek_v2 import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
from runtime.models.llama import LlamaForCausalLM
from runtime.models.qwen2_moe import Qwen2MoeForCausalLM

MODEL_CLASSES: dict[str, type[CausalLM]] = {
    "deepseek_v2": DeepseekV2ForCausalLM,
    "deepseek_v3": DeepseekV3ForCausalLM,
    "qwen2_moe": Qwen2MoeForCausalLM,
    "llama": LlamaForCausalLM,
}


def build_model(
    hf_config: dict[str, Any] | None,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cuda",
    load_format: str = "dummy",
    path: str | Path | None = None,
    seed: int = 0,
    parallel: ModelParallel = SINGLE,
) -> CausalLM:
    """hf_config: config.json fields (None: read path/config.json). load_format: "dummy" (seeded,
    initialised on `device`) or "safetensors" (from the local directory `path`). `parallel`: build this
    rank's shard of a tensor-/expert-parallel model (either format gives it the tp=1 model's values)."""
    if hf_config is None:
        if path is None:
            raise ValueError("need hf_config or path")
        hf_config = json.loads((Path(path) / "config.json").read_text())
    config = ModelConfig.from_hf(hf_config)
    model = MODEL_CLASSES[config.model_type](config, dtype, device, parallel)
    if load_format == "dummy":
        init_dummy_weights(model, seed)
    elif load_format == "safetensors":
        if path is None:
            raise ValueError("load_format=safetensors needs path")
        model.load_weights(iter_safetensors(path))
    else:
        raise ValueError(f"load_format {load_format!r}: expected 'dummy' or 'safetensors'")
    return model.eval()


@torch.no_grad()
def init_dummy_weights(model: CausalLM, seed: int = 0) -> None:
    """Deterministic random weights, generated on the model's device: matrices ~ N(0, 1/fan_in) with
    fan_in = last dim (keeps activations O(1) through every layer), norms 1, biases 0,
    e_score_correction_bias ~ U(0, 0.01). A sharded parameter draws its full tensor from the same
    generator and keeps its piece, so every layout holds the values tp=1 holds."""
    gen = torch.Generator(device=model.device).manual_seed(seed)
    for name, param in model.named_parameters():
        spec = shard_spec(param)
        full = param if spec is None else torch.empty(spec.full_shape(param.shape), dtype=param.dtype,
                                                      device=param.device)
        if name.endswith("e_score_correction_bias"):
            full.uniform_(0.0, 0.01, generator=gen)
        elif full.dim() == 1:
            full.fill_(0.0 if name.endswith("bias") else 1.0)
        else:
            full.normal_(0.0, full.shape[-1] ** -0.5, generator=gen)
        if spec is not None:
            param.copy_(spec.narrow(full))
            del full
    model.post_load()


def checkpoint_files(path: str | Path) -> list[Path]:
    """model.safetensors.index.json's shards, else model.safetensors, else every *.safetensors."""
    root = Path(path)
    index = root / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [root / shard for shard in shards]
    single = root / "model.safetensors"
    files = [single] if single.exists() else sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors checkpoint in {root}")
    return files


def iter_safetensors(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, CPU tensor) of every tensor, one file open at a time."""
    from safetensors import safe_open

    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)
