"""ParallelLayout validation messages, hardware specs and THE KV-capacity function."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from runtime.core.hardware import HardwareSpec
from runtime.core.layout import (LayoutError, ParallelLayout, kv_capacity_tokens, valid_tp_sizes,
                                 weight_bytes_per_gpu)
from runtime.core.model_spec import ModelSpec

ROOT = Path(__file__).resolve().parents[2]
HARDWARE_YAMLS = sorted((ROOT / "conf" / "hardware").glob("*.yaml"))


def load(group: str, name: str):
    return instantiate(OmegaConf.load(ROOT / "conf" / group / f"{name}.yaml"))


@pytest.fixture(scope="module")
def h200() -> HardwareSpec:
    return load("hardware", "h200")


@pytest.mark.parametrize("path", HARDWARE_YAMLS, ids=lambda p: p.stem)
def test_every_hardware_yaml_instantiates(path: Path) -> None:
    hw = instantiate(OmegaConf.load(path))
    assert isinstance(hw, HardwareSpec) and hw.name == path.stem
    assert hw.peak_fp8_flops >= hw.peak_bf16_flops > 0
    assert hw.memory_bytes > (1e9 if hw.name == "cpu" else 40e9)   # cpu: the CPU runtime's KV budget


def test_hardware_rejects_nonpositive_numbers() -> None:
    with pytest.raises(ValueError, match="memory_bytes"):
        HardwareSpec("x", 0, 1e12, 1e12, 1e12, 1e9)


def test_num_gpus_is_tp_pp_dp() -> None:
    assert ParallelLayout(tp=4, ep=2, dp=3, pp=2).num_gpus == 24


def test_bad_tp_names_the_dimension_and_valid_options() -> None:
    with pytest.raises(ValueError) as err:
        ParallelLayout(tp=3).validate(load("model", "deepseek_v2_lite"))
    msg = str(err.value)
    assert "tp=3" in msg and "num_attention_heads=16" in msg and "deepseek_v2_lite" in msg
    assert msg.endswith("valid tp: 1, 2, 4, 8, 16")


def test_gqa_tp_may_replicate_kv_heads() -> None:
    llama = load("model", "llama3_8b")
    ParallelLayout(tp=16).validate(llama)          # 8 kv heads, each on 2 ranks
    assert valid_tp_sizes(llama) == [1, 2, 4, 8, 16, 32]
    with pytest.raises(ValueError, match="num_key_value_heads=8"):
        odd = ModelSpec("odd", dict(llama.hf_config, num_attention_heads=24))
        ParallelLayout(tp=3).validate(odd)


def test_ep_rules() -> None:
    v2 = load("model", "deepseek_v2_lite")
    ParallelLayout(tp=8, ep=8).validate(v2)
    ParallelLayout(tp=8, ep=2).validate(v2)
    with pytest.raises(ValueError, match=r"ep=3 must divide tp=4.*valid ep: 1, 2, 4"):
        ParallelLayout(tp=4, ep=3).validate(v2)
    with pytest.raises(ValueError, match="num_experts=60 of qwen2_moe"):
        ParallelLayout(tp=8, ep=8).validate(load("model", "qwen2_moe"))
    with pytest.raises(ValueError, match="llama3_8b is dense"):
        ParallelLayout(tp=2, ep=2).validate(load("model", "llama3_8b"))


def test_pp_and_degree_rules() -> None:
    v2 = load("model", "deepseek_v2_lite")
    ParallelLayout(pp=2).validate(v2)                # 27 layers: stages of 14 and 13, as SGLang splits
    with pytest.raises(ValueError, match=r"pp=28 exceeds num_layers=27.*valid pp: 1 to 27"):
        ParallelLayout(pp=28).validate(v2)
    with pytest.raises(ValueError, match="dp must be >= 1"):
        ParallelLayout(dp=0).validate(v2)


def test_deepseek_v2_lite_capacity_on_one_h200(h200: HardwareSpec) -> None:
    m = load("model", "deepseek_v2_lite")
    tokens = kv_capacity_tokens(m, h200, ParallelLayout())
    assert m.kv_bytes_per_token(2) == 31104
    expected = (h200.memory_bytes * 0.88 - m.weight_bytes_per_gpu(ParallelLayout())) // 31104
    assert tokens == expected and 2.5e6 < tokens < 3.5e6
    fp8_kv = kv_capacity_tokens(m, h200, ParallelLayout(), kv_dtype_bytes=1)
    assert fp8_kv == pytest.approx(2 * tokens, abs=2)
    reserved = kv_capacity_tokens(m, h200, ParallelLayout(), activation_reserve_bytes=int(31104e3))
    assert reserved == tokens - 1000


def test_tp_grows_capacity(h200: HardwareSpec) -> None:
    for name in ("deepseek_v2_lite", "llama3_8b"):
        m = load("model", name)
        assert kv_capacity_tokens(m, h200, ParallelLayout(tp=2)) > kv_capacity_tokens(
            m, h200, ParallelLayout(tp=1))


def test_capacity_is_per_replica_and_per_stage(h200: HardwareSpec) -> None:
    m = load("model", "deepseek_v2_lite")
    one = kv_capacity_tokens(m, h200, ParallelLayout())
    assert kv_capacity_tokens(m, h200, ParallelLayout(dp=4)) == one
    assert kv_capacity_tokens(m, h200, ParallelLayout(pp=3)) > 2.9 * one


def test_deepseek_v3_fp8_fits_eight_h200_not_one(h200: HardwareSpec) -> None:
    m = load("model", "deepseek_v3")
    assert kv_capacity_tokens(m, h200, ParallelLayout(tp=8)) > 300_000
    with pytest.raises(ValueError, match=r"deepseek_v3 weights \(float8\).*try tp=8"):
        kv_capacity_tokens(m, h200, ParallelLayout(tp=1))
    bf16 = ModelSpec("deepseek_v3_bf16", m.hf_config, weight_dtype="bfloat16")
    with pytest.raises(ValueError, match=r"169\.\d GB per GPU with tp=8.*try tp=16"):
        kv_capacity_tokens(bf16, h200, ParallelLayout(tp=8))


def test_mem_fraction_bounds(h200: HardwareSpec) -> None:
    with pytest.raises(ValueError, match="mem_fraction_static"):
        kv_capacity_tokens(load("model", "llama3_8b"), h200, ParallelLayout(),
                           mem_fraction_static=1.5)


def test_layout_errors_are_one_line_layout_errors() -> None:
    v2 = load("model", "deepseek_v2_lite")
    for bad in (ParallelLayout(tp=3), ParallelLayout(tp=4, ep=3), ParallelLayout(pp=28),
                ParallelLayout(tp=8, dp=3, dp_attention=True)):
        with pytest.raises(LayoutError) as err:
            bad.validate(v2)
        assert "\n" not in str(err.value) and "valid" in str(err.value)


def test_dp_attention_puts_dp_inside_tp() -> None:
    v2 = load("model", "deepseek_v2_lite")
    layout = ParallelLayout(tp=8, dp=4, dp_attention=True)
    layout.validate(v2)
    assert layout.num_gpus == 8 and layout.attention_tp == 2
    assert ParallelLayout(tp=8, dp=4).num_gpus == 32 and ParallelLayout(tp=8, dp=4).attention_tp == 8
    with pytest.raises(LayoutError, match=r"dp=3 does not divide tp=8 .*valid dp: 1, 2, 4, 8$"):
        ParallelLayout(tp=8, dp=3, dp_attention=True).validate(v2)


def test_dp_attention_capacity_per_attention_rank(h200: HardwareSpec) -> None:
    """MLA caches the latent on every rank, so per-GPU KV per token does not shrink with tp; with
    dp attention each rank holds its own requests, and the attention weights are replicated."""
    v3 = load("model", "deepseek_v3")
    tp8 = ParallelLayout(tp=8)
    dpa = ParallelLayout(tp=8, dp=8, dp_attention=True)
    assert weight_bytes_per_gpu(v3, dpa) > weight_bytes_per_gpu(v3, tp8) == v3.weight_bytes_per_gpu(tp8)
    per_rank = kv_capacity_tokens(v3, h200, dpa)
    # the replicated weights come out of the KV pool, token for token (MLA: the same KV per GPU either way)
    extra_bytes = weight_bytes_per_gpu(v3, dpa) - weight_bytes_per_gpu(v3, tp8)
    kv_token_bytes = v3.kv_bytes_per_token_per_layer(2, 1) * v3.num_layers
    assert abs(kv_capacity_tokens(v3, h200, tp8) - extra_bytes / kv_token_bytes - per_rank) <= 1
    # each attention rank embeds and samples its own tokens: embedding and LM head whole at attention_tp=1
    vocab_bytes = v3.embedding_params() * v3.bytes_per_param("embedding") + \
        v3.lm_head_params() * v3.bytes_per_param("lm_head")
    assert extra_bytes > vocab_bytes * (1 - 1 / 8)
    llama = load("model", "llama3_8b")         # GQA: KV heads split attention_tp ways, not tp
    gqa = kv_capacity_tokens(llama, h200, ParallelLayout(tp=8, dp=4, dp_attention=True))
    assert gqa < kv_capacity_tokens(llama, h200, ParallelLayout(tp=8))
    assert gqa > kv_capacity_tokens(llama, h200, ParallelLayout(tp=2))
