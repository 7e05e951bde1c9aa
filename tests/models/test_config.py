"""Config reading (transformers 4.x and 5.x spellings) and rope/softmax scaling against HF's own code."""
from __future__ import annotations

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from runtime.models.config import ModelConfig
from runtime.models.loader import build_model
from runtime.models.rotary import inv_freq_and_scaling
from tests.models.hf_models import hf_config, make_hf_model
from tests.models.test_kv_pool import MODEL_YAMLS, load_spec

YARN = dict(type="yarn", factor=40, original_max_position_embeddings=4096, mscale=0.707,
            mscale_all_dim=0.707, beta_fast=32, beta_slow=1)


def test_rope_scaling_and_rope_parameters_read_the_same() -> None:
    base = dict(model_type="deepseek_v2", max_position_embeddings=163840, q_lora_rank=None)
    old = ModelConfig.from_hf({**base, "rope_theta": 10000, "rope_scaling": YARN})
    new = ModelConfig.from_hf({**base, "rope_parameters": {**YARN, "rope_type": "yarn", "rope_theta": 10000}})
    assert old.rope == new.rope and old.rope.rope_type == "yarn" and old.rope.interleaved
    assert old.q_lora_rank is None


@pytest.mark.parametrize("path", MODEL_YAMLS, ids=lambda p: p.stem)
def test_every_model_yaml_reads(path) -> None:
    spec = load_spec(path)
    cfg = ModelConfig.from_hf(spec.hf_config)
    assert cfg.num_hidden_layers == spec.num_layers
    assert [cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers)] == \
        [spec.is_moe_layer(i) for i in range(spec.num_layers)]


def _hf_configs() -> dict[str, transformers.PretrainedConfig]:
    yamls = {p.stem: load_spec(p).hf_config for p in MODEL_YAMLS}
    return {"tiny_deepseek_v3": hf_config("deepseek_v3"), "tiny_llama3": hf_config("llama"),
            "deepseek_v2_lite": transformers.DeepseekV2Config(**yamls["deepseek_v2_lite"]),
            "deepseek_v3": transformers.DeepseekV3Config(**yamls["deepseek_v3"])}


@pytest.mark.parametrize("name", ["tiny_deepseek_v3", "tiny_llama3", "deepseek_v2_lite", "deepseek_v3"])
def test_inv_freq_and_attention_factor_match_hf(name: str) -> None:
    hf_cfg = _hf_configs()[name]
    hf_inv, hf_factor = ROPE_INIT_FUNCTIONS[hf_cfg.rope_parameters["rope_type"]](hf_cfg, None)
    ours = ModelConfig.from_hf(hf_cfg.to_dict())
    dim = ours.qk_rope_head_dim if ours.use_mla else ours.head_dim
    inv, factor = inv_freq_and_scaling(ours.rope, dim, ours.max_position_embeddings)
    torch.testing.assert_close(inv, hf_inv.float(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(hf_factor, rel=1e-9)
    assert not torch.allclose(inv, 1.0 / ours.rope.theta ** (torch.arange(0, dim, 2).float() / dim))


def test_mla_softmax_scale_includes_yarn_mscale() -> None:
    hf = make_hf_model("deepseek_v3")
    ours = build_model(hf.config.to_dict(), torch.float32, "cpu")
    hf_scale = hf.model.layers[0].self_attn.scaling
    assert ours.model.layers[0].self_attn.scale == pytest.approx(hf_scale, rel=1e-12)
    assert hf_scale != pytest.approx((16 + 8) ** -0.5)


def test_unknown_model_type_is_rejected() -> None:
    with pytest.raises(NotImplementedError):
        ModelConfig.from_hf(transformers.MistralConfig().to_dict())
