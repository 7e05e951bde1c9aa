"""KV pools: slot-addressed writes land where asked, and bytes/token equals ModelSpec's arithmetic."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from runtime.core.model_spec import ModelSpec
from runtime.engine.kv_pool import MHAKVPool, MLAKVPool, create_kv_pool
from runtime.models.config import ModelConfig

MODEL_YAMLS = sorted((Path(__file__).parents[2] / "conf" / "model").glob("*.yaml"))


def load_spec(path: Path) -> ModelSpec:
    raw = yaml.safe_load(path.read_text())
    return ModelSpec(name=raw["name"], hf_config=raw["hf_config"], weight_dtype=raw["weight_dtype"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("path", MODEL_YAMLS, ids=lambda p: p.stem)
def test_bytes_per_token_equals_model_spec(path: Path, dtype: torch.dtype) -> None:
    spec = load_spec(path)
    pool = create_kv_pool(ModelConfig.from_hf(spec.hf_config), num_slots=1, dtype=dtype, device="cpu")
    assert isinstance(pool, MLAKVPool if spec.is_mla else MHAKVPool)
    assert pool.bytes_per_token() == spec.kv_bytes_per_token(dtype.itemsize)


def test_mha_write_touches_only_the_given_slots_of_one_layer() -> None:
    pool = MHAKVPool(num_layers=2, num_slots=10, num_kv_heads=2, head_dim=4, v_head_dim=3,
                     dtype=torch.float32, device="cpu")
    loc = torch.tensor([7, 2, 5])
    k, v = torch.randn(3, 2, 4), torch.randn(3, 2, 3)
    pool.write(1, loc, k, v)
    k_buf, v_buf = pool.get_kv(1)
    assert torch.equal(k_buf[loc], k) and torch.equal(v_buf[loc], v)
    untouched = torch.tensor([0, 1, 3, 4, 6, 8, 9])
    assert not k_buf[untouched].any() and not pool.get_kv(0)[0].any()


def test_mla_write_stores_latent_then_rope_key() -> None:
    pool = MLAKVPool(num_layers=1, num_slots=6, kv_lora_rank=4, rope_dim=2, dtype=torch.float32, device="cpu")
    c_kv, k_pe = torch.randn(2, 4), torch.randn(2, 2)
    pool.write(0, torch.tensor([4, 1]), c_kv, k_pe)
    assert torch.equal(pool.get_kv(0)[[4, 1]], torch.cat([c_kv, k_pe], dim=1))
    assert pool.bytes_per_token() == 6 * 4
