"""The model's architecture as the model code reads it, from a dict of Hugging Face fields
(config.json or ModelSpec.hf_config, whose `config` it is): one config for the runtime and the
simulator. Accepts transformers 4.x (`rope_scaling`, top-level `rope_theta`) and 5.x
(`rope_parameters`) spellings. Must not import torch, simpy or time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Family of each supported HF `model_type`; DeepSeek-V2/V3 share one implementation.
FAMILIES = {"deepseek_v2": "deepseek", "deepseek_v3": "deepseek", "qwen2_moe": "qwen2_moe", "llama": "llama"}
_ARCH_TO_TYPE = {
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "LlamaForCausalLM": "llama",
}

# Defaults transformers uses when a field is absent from config.json, per model_type (only fields we read).
_DEFAULTS: dict[str, dict[str, Any]] = {
    "deepseek_v2": dict(
        vocab_size=102400, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, max_position_embeddings=2048, q_lora_rank=1536, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=64,
        n_shared_experts=2, moe_intermediate_size=1407, num_experts_per_tok=None, n_group=None,
        topk_group=None, topk_method="greedy", scoring_func="softmax", norm_topk_prob=False,
        routed_scaling_factor=1.0, first_k_dense_replace=0, moe_layer_freq=1, rope_interleave=True,
    ),
    "deepseek_v3": dict(
        vocab_size=129280, hidden_size=7168, intermediate_size=18432, num_hidden_layers=61,
        num_attention_heads=128, max_position_embeddings=4096, q_lora_rank=1536, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256,
        n_shared_experts=1, moe_intermediate_size=2048, num_experts_per_tok=8, n_group=8,
        topk_group=4, topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True,
        routed_scaling_factor=2.5, first_k_dense_replace=3, moe_layer_freq=1, rope_interleave=True,
    ),
    "qwen2_moe": dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
        num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=32768,
        rope_theta=10000.0, num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632, norm_topk_prob=False, decoder_sparse_step=1,
        mlp_only_layers=[], qkv_bias=True,
    ),
    "llama": dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, max_position_embeddings=2048, attention_bias=False, mlp_bias=False,
    ),
}


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters. `rope_type`: default | linear | llama3 | yarn.
    `interleaved`: rotate pairs (x0, x1), (x2, x3)... (DeepSeek) instead of halves (NeoX/Llama)."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    low_freq_factor: float = 1.0        # llama3
    high_freq_factor: float = 4.0       # llama3
    beta_fast: float = 32.0             # yarn
    beta_slow: float = 1.0              # yarn
    mscale: float | None = None         # yarn (DeepSeek)
    mscale_all_dim: float | None = None  # yarn (DeepSeek); also scales the MLA softmax
    attention_factor: float | None = None  # yarn: scale of cos/sin; derived when None
    truncate: bool = True               # yarn
    interleaved: bool = False


@dataclass(frozen=True)
class ModelConfig:
    """What our model code reads. Build with `ModelConfig.from_hf(dict)`; fields mirror HF names."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int                      # per-head q/k width: MHA head dim; MLA qk_nope + qk_rope
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    attention_bias: bool = False       # Llama q/k/v/o bias; DeepSeek q_a/kv_a/o bias
    qkv_bias: bool = False             # Qwen2-MoE q/k/v bias
    mlp_bias: bool = False
    rope: RopeConfig = field(default_factory=RopeConfig)
    # MLA (DeepSeek)
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # MoE
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    n_shared_experts: int = 0                 # DeepSeek: shared MLP of n * moe_intermediate_size
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: sigmoid-gated shared expert
    scoring_func: str = "softmax"             # softmax | sigmoid
    topk_method: str = "greedy"               # greedy | group_limited_greedy | noaux_tc
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = False
    routed_scaling_factor: float = 1.0
    first_k_dense_replace: int = 0
    moe_layer_freq: int = 1
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    @property
    def family(self) -> str:
        return FAMILIES[self.model_type]

    @property
    def use_mla(self) -> bool:
        return self.family == "deepseek"

    def is_moe_layer(self, layer: int) -> bool:
        if self.num_experts <= 0:
            return False
        if self.family == "deepseek":
            return layer >= self.first_k_dense_replace and layer % self.moe_layer_freq == 0
        if self.family == "qwen2_moe":
            return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0
        return False

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "ModelConfig":
        model_type = _model_type(hf)
        # a null field takes the HF default, except q_lora_rank where null means "no q LoRA"
        cfg = {**_DEFAULTS[model_type], **{k: v for k, v in hf.items() if v is not None or k == "q_lora_rank"}}
        heads = cfg["num_attention_heads"]
        family = FAMILIES[model_type]
        common = dict(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"] if family == "deepseek"
            else (cfg.get("head_dim") or cfg["hidden_size"] // heads),
            max_position_embeddings=cfg["max_position_embeddings"],
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            hidden_act=cfg.get("hidden_act", "silu"),
            attention_bias=bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            rope=_read_rope(cfg, interleaved=family == "deepseek" and (
                model_type == "deepseek_v2" or bool(cfg.get("rope_interleave", True)))),
        )
        if common["hidden_act"] != "silu":
            raise NotImplementedError(f"hidden_act={common['hidden_act']!r}: only silu is supported")
        if family == "deepseek":
            return cls(**common, **_deepseek_fields(cfg))
        if family == "qwen2_moe":
            return cls(
                **common,
                qkv_bias=bool(cfg.get("qkv_bias", True)),
                num_experts=cfg["num_experts"],
                num_experts_per_tok=cfg["num_experts_per_tok"],
                moe_intermediate_size=cfg["moe_intermediate_size"],
                shared_expert_intermediate_size=cfg.get("shared_expert_intermediate_size") or 0,
                norm_topk_prob=bool(cfg["norm_topk_prob"]),
                decoder_sparse_step=cfg.get("decoder_sparse_step") or 1,
                mlp_only_layers=tuple(cfg.get("mlp_only_layers") or ()),
            )
        return cls(**common)


def _model_type(hf: dict[str, Any]) -> str:
    model_type = hf.get("model_type")
    if model_type is None:
        archs = hf.get("architectures") or []
        model_type = next((_ARCH_TO_TYPE[a] for a in archs if a in _ARCH_TO_TYPE), None)
    if model_type not in FAMILIES:
        raise NotImplementedError(f"model_type {model_type!r} not supported; known: {sorted(FAMILIES)}")
    return model_type


def _deepseek_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(
        q_lora_rank=cfg.get("q_lora_rank"),
        kv_lora_rank=cfg["kv_lora_rank"],
        qk_nope_head_dim=cfg["qk_nope_head_dim"],
        qk_rope_head_dim=cfg["qk_rope_head_dim"],
        v_head_dim=cfg["v_head_dim"],
        num_experts=cfg.get("n_routed_experts") or 0,
        num_experts_per_tok=cfg.get("num_experts_per_tok") or 0,
        moe_intermediate_size=cfg["moe_intermediate_size"],
        n_shared_experts=cfg.get("n_shared_experts") or 0,
        scoring_func=cfg["scoring_func"],
        topk_method=cfg["topk_method"],
        n_group=cfg.get("n_group") or 1,
        topk_group=cfg.get("topk_group") or 1,
        norm_topk_prob=bool(cfg["norm_topk_prob"]),
        routed_scaling_factor=float(cfg["routed_scaling_factor"]),
        first_k_dense_replace=cfg.get("first_k_dense_replace") or 0,
        moe_layer_freq=cfg.get("moe_layer_freq") or 1,
    )


def _read_rope(cfg: dict[str, Any], interleaved: bool) -> RopeConfig:
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    orig = cfg.get("original_max_position_embeddings") or params.get(
        "original_max_position_embeddings", cfg["max_position_embeddings"])
    if rope_type not in ("default", "linear", "llama3", "yarn"):
        raise NotImplementedError(f"rope_type {rope_type!r} not supported")
    return RopeConfig(
        theta=float(theta),
        rope_type=rope_type,
        factor=params.get("factor"),
        original_max_position_embeddings=orig,
        low_freq_factor=params.get("low_freq_factor", 1.0),
        high_freq_factor=params.get("high_freq_factor", 4.0),
        beta_fast=params.get("beta_fast") or 32.0,
        beta_slow=params.get("beta_slow") or 1.0,
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        attention_factor=params.get("attention_factor"),
        truncate=params.get("truncate", True),
        interleaved=interleaved,
    )
