"""Model architecture read from a Hugging Face config: sizes, parameter counts, weight and KV bytes.

Must not import torch, simpy or time (runtime/core). The real runtime builds its modules from
`hf_config`; the KV-capacity arithmetic and the simulator's cost models read the derived sizes.
"""
from __future__ import annotations

import json
from pathlib import Path

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from runtime.core.model_config import ModelConfig

if TYPE_CHECKING:
    from runtime.core.layout import ParallelLayout

ARCHITECTURES = ("deepseek_v2", "deepseek_v3", "qwen2_moe", "llama")
WEIGHT_DTYPES = ("bfloat16", "float8", "float32")
# DeepSeek-V3's fp8 checkpoint: e4m3 linear weights with one fp32 scale per 128x128 block;
# embeddings, lm_head, norms, biases and router gates stay bf16.
FP8_BLOCK = 128
QUANTIZABLE_PARTS = ("attention", "dense_mlp", "routed_experts", "shared_experts")
LAYER_PARTS = ("attention", "norms_and_biases", "dense_mlp", "router", "routed_experts",
               "shared_experts")


def _plain(value: Any) -> Any:
    """Deep-copy mappings/sequences (e.g. OmegaConf containers) into plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


def _read_checkpoint_config(path: str) -> dict:
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"model.path={path}: no config.json there (a local Hugging Face "
                                "checkpoint directory is expected; nothing is downloaded)")
    return json.loads(config_file.read_text())


@dataclass(frozen=True)
class ModelSpec:
    """One model: `hf_config` holds config.json fields under their Hugging Face names.

    Derived sizes are properties. Per-GPU numbers follow SGLang's sharding: vocab, q/o heads,
    kv_b, MLPs and experts split over TP; MLA's q_a/kv_a projections, norms and router gates
    replicated; GQA kv heads split while tp <= num_kv_heads, then replicated.
    """

    name: str
    hf_config: dict = field(repr=False, hash=False)   # hashed by name and dtype only
    weight_dtype: str = "bfloat16"
    path: str | None = None   # a local HF checkpoint dir: its config.json replaces hf_config

    def __post_init__(self) -> None:
        if self.path is not None:
            object.__setattr__(self, "hf_config", _read_checkpoint_config(self.path))
        object.__setattr__(self, "hf_config", _plain(self.hf_config))
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"model {self.name}: model_type {self.architecture!r} is not one "
                             f"of {', '.join(ARCHITECTURES)}")
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"model {self.name}: weight_dtype {self.weight_dtype!r} is not "
                             f"one of {', '.join(WEIGHT_DTYPES)}")

    def _get(self, key: str, default: Any = None) -> Any:
        value = self.hf_config.get(key)
        return default if value is None else value

    # -- architecture ---------------------------------------------------------------
    @cached_property
    def config(self) -> ModelConfig:
        """The architecture as the runtime's model code reads it (HF defaults filled in)."""
        return ModelConfig.from_hf(self.hf_config)

    @property
    def architecture(self) -> str:
        return str(self.hf_config.get("model_type", ""))

    @property
    def num_layers(self) -> int:
        return int(self.hf_config["num_hidden_layers"])

    @property
    def hidden_size(self) -> int:
        return int(self.hf_config["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config["vocab_size"])

    @property
    def num_attention_heads(self) -> int:
        return int(self.hf_config["num_attention_heads"])

    @property
    def num_kv_heads(self) -> int:
        """Config's num_key_value_heads (MLA caches one shared latent instead, see is_mla)."""
        return int(self._get("num_key_value_heads", self.num_attention_heads))

    @property
    def is_mla(self) -> bool:
        return self.architecture.startswith("deepseek") and self.kv_lora_rank > 0

    @property
    def head_dim(self) -> int:
        """Per-head q/k width: qk_nope + qk_rope for MLA, else head_dim or hidden / heads
        (the same meaning as ModelConfig.head_dim, which it reads)."""
        return self.config.head_dim

    @property
    def kv_lora_rank(self) -> int:
        return int(self._get("kv_lora_rank", 0))

    @property
    def q_lora_rank(self) -> int | None:
        rank = self.hf_config.get("q_lora_rank")
        return None if rank is None else int(rank)

    @property
    def qk_rope_head_dim(self) -> int:
        return int(self._get("qk_rope_head_dim", 0))

    @property
    def qk_nope_head_dim(self) -> int:
        return int(self._get("qk_nope_head_dim", 0))

    @property
    def v_head_dim(self) -> int:
        return int(self._get("v_head_dim", self.head_dim if not self.is_mla else 0))

    @property
    def has_qkv_bias(self) -> bool:
        """Qwen2-MoE always biases q/k/v; Llama when attention_bias is set."""
        return self.architecture == "qwen2_moe" or (
            self.architecture == "llama" and bool(self._get("attention_bias", False)))

    @property
    def intermediate_size(self) -> int:
        """Dense MLP width (DeepSeek's first_k_dense_replace layers, every Llama layer)."""
        return int(self.hf_config["intermediate_size"])

    # -- mixture of experts ---------------------------------------------------------
    @property
    def num_experts(self) -> int:
        """Routed experts per MoE layer; 0 for a dense model."""
        return int(self._get("n_routed_experts", self._get("num_experts", 0)))

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def num_experts_per_tok(self) -> int:
        return int(self._get("num_experts_per_tok", 0)) if self.is_moe else 0

    @property
    def moe_intermediate_size(self) -> int:
        return int(self._get("moe_intermediate_size", 0))

    @property
    def num_shared_experts(self) -> int:
        if self.architecture == "qwen2_moe":
            return 1 if self.shared_expert_intermediate_size > 0 else 0
        return int(self._get("n_shared_experts", 0))

    @property
    def shared_expert_intermediate_size(self) -> int:
        """Total width of the shared expert(s): DeepSeek n_shared * moe_intermediate_size."""
        if self.architecture == "qwen2_moe":
            return int(self._get("shared_expert_intermediate_size", 0))
        return self.num_shared_experts * self.moe_intermediate_size

    @property
    def first_k_dense_replace(self) -> int:
        return int(self._get("first_k_dense_replace", 0))

    def is_moe_layer(self, layer: int) -> bool:
        """Which decoder layers route through experts, as the HF modeling code decides."""
        if not self.is_moe:
            return False
        if self.architecture == "qwen2_moe":
            step = int(self._get("decoder_sparse_step", 1))
            return layer not in self._get("mlp_only_layers", []) and (layer + 1) % step == 0
        freq = int(self._get("moe_layer_freq", 1))
        return layer >= self.first_k_dense_replace and layer % freq == 0

    @property
    def moe_layer_ids(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if self.is_moe_layer(i))

    # -- misc -----------------------------------------------------------------------
    @property
    def max_context_tokens(self) -> int:
        return int(self.hf_config["max_position_embeddings"])

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        eos = self.hf_config.get("eos_token_id")
        if eos is None:
            return ()
        return tuple(int(e) for e in eos) if isinstance(eos, list) else (int(eos),)

    @property
    def eos_token_id(self) -> int | None:
        """The first end-of-sequence id (see eos_token_ids for all of them)."""
        ids = self.eos_token_ids
        return ids[0] if ids else None

    @property
    def tie_word_embeddings(self) -> bool:
        return bool(self._get("tie_word_embeddings", False))

    # -- KV cache -------------------------------------------------------------------
    def kv_heads_per_rank(self, tp: int = 1) -> int:
        """GQA kv heads held by one TP rank; replicated once tp exceeds num_kv_heads."""
        return max(1, self.num_kv_heads // tp)

    def kv_bytes_per_token_per_layer(self, kv_dtype_bytes: int, tp: int = 1) -> int:
        """Bytes one token's KV takes in one layer on one TP rank. MLA caches the compressed
        latent plus the shared rope key, replicated on every rank (as SGLang does)."""
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * kv_dtype_bytes
        return 2 * self.kv_heads_per_rank(tp) * self.head_dim * kv_dtype_bytes

    def kv_bytes_per_token(self, kv_dtype_bytes: int, tp: int = 1) -> int:
        """Bytes one token's KV takes over all layers on one TP rank."""
        return self.kv_bytes_per_token_per_layer(kv_dtype_bytes, tp) * self.num_layers

    # -- parameters -----------------------------------------------------------------
    def _attention_parts(self) -> list[tuple[str, int, str]]:
        """(part, params, shard) of one attention block; shard is rep | tp | kv."""
        h, heads = self.hidden_size, self.num_attention_heads
        if not self.is_mla:
            d, kv = self.head_dim, self.num_kv_heads
            parts = [("attention", h * heads * d, "tp"), ("attention", 2 * h * kv * d, "kv"),
                     ("attention", heads * d * h, "tp")]
            if self.has_qkv_bias:
                parts += [("norms_and_biases", heads * d, "tp"),
                          ("norms_and_biases", 2 * kv * d, "kv")]
            return parts
        qk, r, kvr = self.head_dim, self.qk_rope_head_dim, self.kv_lora_rank
        q_rank = self.q_lora_rank
        if q_rank is None:
            parts = [("attention", h * heads * qk, "tp")]                        # q_proj
        else:
            parts = [("attention", h * q_rank, "rep"), ("norms_and_biases", q_rank, "rep"),
                     ("attention", q_rank * heads * qk, "tp")]                   # q_a, norm, q_b
        parts += [("attention", h * (kvr + r), "rep"),                           # kv_a_proj
                  ("norms_and_biases", kvr, "rep"),                              # kv_a_layernorm
                  ("attention", kvr * heads * (self.qk_nope_head_dim + self.v_head_dim), "tp"),
                  ("attention", heads * self.v_head_dim * h, "tp")]              # kv_b, o_proj
        return parts

    def _mlp_parts(self, layer: int) -> list[tuple[str, int, str]]:
        h = self.hidden_size
        if not self.is_moe_layer(layer):
            return [("dense_mlp", 3 * h * self.intermediate_size, "tp")]
        e = self.num_experts
        parts = [("router", e * h, "rep"),
                 ("routed_experts", e * 3 * h * self.moe_intermediate_size, "tp")]
        if self._get("topk_method") == "noaux_tc":
            parts.append(("router", e, "rep"))                     # e_score_correction_bias
        if self.shared_expert_intermediate_size:
            parts.append(("shared_experts", 3 * h * self.shared_expert_intermediate_size, "tp"))
        if self.architecture == "qwen2_moe" and self.shared_expert_intermediate_size:
            parts.append(("router", h, "rep"))                     # shared_expert_gate
        return parts

    def layer_params_by_part(self, layer: int, tp: int = 1) -> dict[str, int]:
        """Parameters of decoder `layer` held by one TP rank, by part (LAYER_PARTS).
        Routed experts are split tp ways whatever ep is: ep experts groups x tp/ep slices."""
        out = dict.fromkeys(LAYER_PARTS, 0)
        kv_share = self.kv_heads_per_rank(tp) / max(1, self.num_kv_heads)
        parts = self._attention_parts() + self._mlp_parts(layer)
        parts.append(("norms_and_biases", 2 * self.hidden_size, "rep"))
        for part, params, shard in parts:
            share = {"rep": 1.0, "tp": 1.0 / tp, "kv": kv_share}[shard]
            out[part] += round(params * share)
        return out

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def lm_head_params(self) -> int:
        """0 when tied to the embedding (the same tensor, counted once)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def num_params(self) -> int:
        """All parameters of the main model (DeepSeek-V3's MTP layer excluded)."""
        layers = sum(sum(self.layer_params_by_part(i).values()) for i in range(self.num_layers))
        return self.embedding_params() + self.lm_head_params() + self.hidden_size + layers

    def num_active_params(self) -> int:
        """Parameters one token computes with: all but the unrouted share of routed experts."""
        if not self.is_moe:
            return self.num_params()
        routed = sum(self.layer_params_by_part(i)["routed_experts"] for i in self.moe_layer_ids)
        return self.num_params() - round(routed * (1 - self.num_experts_per_tok / self.num_experts))

    # -- weight bytes ---------------------------------------------------------------
    def bytes_per_param(self, part: str) -> float:
        """Bytes per parameter of `part` (a LAYER_PARTS name, "embedding" or "lm_head")."""
        if self.weight_dtype == "float32":
            return 4.0
        if self.weight_dtype == "float8" and part in QUANTIZABLE_PARTS:
            return 1.0 + 4.0 / (FP8_BLOCK * FP8_BLOCK)
        return 2.0

    def layer_weight_bytes_by_part(self, layer: int, tp: int = 1) -> dict[str, float]:
        params = self.layer_params_by_part(layer, tp)
        return {part: n * self.bytes_per_param(part) for part, n in params.items()}

    def weight_bytes_per_gpu(self, layout: "ParallelLayout") -> int:
        """Weight bytes on the fullest GPU: layers split evenly over pp stages (the first stage
        also holds the embedding, the last the lm_head and final norm), each stage over tp."""
        tp, pp = layout.tp, layout.pp
        per_stage = -(-self.num_layers // pp)
        embed = self.embedding_params() / tp * self.bytes_per_param("embedding")
        head_params = self.vocab_size * self.hidden_size if self.tie_word_embeddings and pp > 1 \
            else self.lm_head_params()
        head = (head_params / tp + self.hidden_size) * self.bytes_per_param("lm_head")
        stages = []
        for s in range(pp):
            layers = range(s * per_stage, min(self.num_layers, (s + 1) * per_stage))
            total = sum(sum(self.layer_weight_bytes_by_part(i, tp).values()) for i in layers)
            total += embed if s == 0 else 0.0
            total += head if s == pp - 1 else 0.0
            stages.append(total)
        return int(max(stages))
