"""ModelSpec: derived sizes, parameter counts against published totals, KV and weight bytes."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from runtime.core.layout import ParallelLayout
from runtime.core.model_spec import ModelSpec

ROOT = Path(__file__).resolve().parents[2]
MODEL_YAMLS = sorted((ROOT / "conf" / "model").glob("*.yaml"))


def load(name: str) -> ModelSpec:
    return instantiate(OmegaConf.load(ROOT / "conf" / "model" / f"{name}.yaml"))


@pytest.mark.parametrize("path", MODEL_YAMLS, ids=lambda p: p.stem)
def test_every_model_yaml_instantiates(path: Path) -> None:
    model = instantiate(OmegaConf.load(path))
    assert isinstance(model, ModelSpec) and model.name == path.stem
    assert type(model.hf_config) is dict
    assert model.num_params() > 0 and model.kv_bytes_per_token(2) > 0


def test_omegaconf_containers_become_plain() -> None:
    cfg = OmegaConf.load(ROOT / "conf" / "model" / "deepseek_v3.yaml")
    model = ModelSpec(name="x", hf_config=cfg.hf_config, weight_dtype="float8")
    assert type(model.hf_config) is dict
    assert type(model.hf_config["quantization_config"]["weight_block_size"]) is list
    assert hash(model) == hash(ModelSpec(name="x", hf_config={"model_type": "llama"},
                                         weight_dtype="float8"))


@pytest.mark.parametrize("name, published, tolerance", [
    ("deepseek_v2_lite", 15.7e9, 0.015),
    ("deepseek_v3", 671e9, 0.015),
    ("qwen2_moe", 14.3e9, 0.015),
    ("llama3_8b", 8.03e9, 0.005),
])
def test_param_count_matches_published(name: str, published: float, tolerance: float) -> None:
    assert load(name).num_params() == pytest.approx(published, rel=tolerance)


@pytest.mark.parametrize("name, active", [("deepseek_v3", 37e9), ("qwen2_moe", 2.7e9),
                                          ("deepseek_v2_lite", 2.4e9)])
def test_active_params_near_published(name: str, active: float) -> None:
    # Published "activated" counts differ in whether embeddings are included: within 15%.
    assert load(name).num_active_params() == pytest.approx(active, rel=0.15)


def test_deepseek_v2_lite_derived_sizes() -> None:
    m = load("deepseek_v2_lite")
    assert m.architecture == "deepseek_v2" and m.is_mla and m.is_moe
    assert m.q_lora_rank is None and m.kv_lora_rank == 512 and m.head_dim == 192
    assert (m.num_experts, m.num_experts_per_tok, m.num_shared_experts) == (64, 6, 2)
    assert m.shared_expert_intermediate_size == 2 * 1408
    assert m.moe_layer_ids == tuple(range(1, 27))
    assert m.eos_token_id == 100001 and m.max_context_tokens == 163840


def test_deepseek_v3_first_three_layers_dense() -> None:
    m = load("deepseek_v3")
    assert m.q_lora_rank == 1536 and not any(m.is_moe_layer(i) for i in range(3))
    assert len(m.moe_layer_ids) == 58
    assert m.layer_params_by_part(5)["router"] == 256 * 7168 + 256   # + e_score_correction_bias


def test_qwen2_moe_sparse_step_and_mlp_only_layers() -> None:
    cfg = dict(load("qwen2_moe").hf_config, decoder_sparse_step=2, mlp_only_layers=[3])
    m = ModelSpec(name="q", hf_config=cfg)
    assert m.moe_layer_ids == tuple(i for i in range(24) if (i + 1) % 2 == 0 and i != 3)
    assert m.num_shared_experts == 1 and m.has_qkv_bias and not m.is_mla


def test_kv_bytes_per_token() -> None:
    assert load("deepseek_v2_lite").kv_bytes_per_token(2) == 576 * 27 * 2
    assert load("deepseek_v3").kv_bytes_per_token(1, tp=8) == 576 * 61   # latent replicated
    llama = load("llama3_8b")
    assert llama.kv_bytes_per_token(2) == 2 * 8 * 128 * 32 * 2
    assert llama.kv_bytes_per_token(2, tp=8) == 2 * 1 * 128 * 32 * 2
    assert llama.kv_bytes_per_token(2, tp=16) == llama.kv_bytes_per_token(2, tp=8)  # replicated


def test_tp_cuts_per_gpu_weight_bytes() -> None:
    for name in ("deepseek_v2_lite", "llama3_8b", "qwen2_moe"):
        m = load(name)
        one = m.weight_bytes_per_gpu(ParallelLayout(tp=1))
        eight = m.weight_bytes_per_gpu(ParallelLayout(tp=8))
        assert one / 8 <= eight < one / 6          # replicated parts keep it above 1/8
    assert load("llama3_8b").weight_bytes_per_gpu(ParallelLayout()) == 2 * 8_030_261_248


def test_fp8_weights_take_about_a_byte_per_param() -> None:
    m = load("deepseek_v3")
    total = m.weight_bytes_per_gpu(ParallelLayout())
    assert total == pytest.approx(m.num_params(), rel=0.01)
    assert m.bytes_per_param("lm_head") == 2.0 and m.bytes_per_param("router") == 2.0


def test_pipeline_stages_split_layers() -> None:
    m = load("llama3_8b")
    full = m.weight_bytes_per_gpu(ParallelLayout())
    half = m.weight_bytes_per_gpu(ParallelLayout(pp=2))
    assert full / 2 < half < full / 2 + m.embedding_params() * 2


def test_eos_list_and_bad_configs() -> None:
    cfg = dict(load("llama3_8b").hf_config, eos_token_id=[128001, 128009])
    assert ModelSpec(name="l", hf_config=cfg).eos_token_ids == (128001, 128009)
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        ModelSpec(name="g", hf_config={"model_type": "gpt2"})
    with pytest.raises(ValueError, match="weight_dtype 'int4'"):
        ModelSpec(name="l", hf_config=cfg, weight_dtype="int4")


def test_tiny_models_are_tiny_and_shaped_like_their_parents() -> None:
    mla = load("tiny_mla_moe")
    assert mla.architecture == "deepseek_v2" and mla.is_mla and mla.moe_layer_ids == (1, 2)
    assert mla.vocab_size == 512 and mla.num_params() < 1e6
    llama = load("tiny_llama")
    assert llama.num_kv_heads < llama.num_attention_heads and llama.num_params() < 1e6


@pytest.mark.parametrize("module", ["model_spec.py", "hardware.py", "layout.py"])
def test_core_modules_import_no_torch_simpy_or_time(module: str) -> None:
    tree = ast.parse((ROOT / "runtime" / "core" / module).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    names |= {(n.module or "").split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom)}
    assert not names & {"torch", "simpy", "time"}


@pytest.mark.parametrize("path", MODEL_YAMLS, ids=lambda p: p.stem)
def test_one_model_config_for_runtime_and_simulator(path: Path) -> None:
    """ModelSpec (simulator, KV capacity) and the runtime read the same torch-free ModelConfig,
    and `head_dim` means the per-head q/k width in both: qk_nope + qk_rope for MLA."""
    from runtime.core.model_config import ModelConfig as CoreConfig
    from runtime.models.config import ModelConfig as RuntimeConfig
    assert CoreConfig is RuntimeConfig
    spec: ModelSpec = instantiate(OmegaConf.load(path))
    cfg = spec.config
    assert spec.head_dim == cfg.head_dim
    if spec.is_mla:
        assert cfg.head_dim == spec.qk_nope_head_dim + spec.qk_rope_head_dim
    else:
        assert cfg.head_dim == spec.hf_config.get("head_dim", spec.hidden_size // spec.num_attention_heads)
    assert [cfg.is_moe_layer(i) for i in range(spec.num_layers)] == [spec.is_moe_layer(i) for i in range(spec.num_layers)]
