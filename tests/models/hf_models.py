"""Tiny Hugging Face models of each family (fixed seed) and helpers to compare ours against them."""
from __future__ import annotations

from pathlib import Path

import torch
import transformers

FAMILIES = ("deepseek_v2", "deepseek_v3", "qwen2_moe", "llama")
VOCAB = 256
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
               max_position_embeddings=512, bos_token_id=None, eos_token_id=None, pad_token_id=None)
_MLA = dict(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, num_key_value_heads=4,
            moe_intermediate_size=24, n_routed_experts=8, first_k_dense_replace=1)


def hf_config(family: str) -> transformers.PretrainedConfig:
    """V2: no q LoRA, softmax group-limited greedy. V3: q LoRA, sigmoid noaux_tc, YaRN.
    Qwen2-MoE: GQA with qkv bias, gated shared expert, one dense layer. Llama: llama3 rope, tied."""
    if family == "deepseek_v2":
        return transformers.DeepseekV2Config(
            **_COMMON, **_MLA, num_hidden_layers=3, q_lora_rank=None, n_shared_experts=2,
            num_experts_per_tok=3,  # > topk_group, so the group limit changes the choice
            topk_method="group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=1.5,
            norm_topk_prob=False, rope_theta=10000.0)
    if family == "deepseek_v3":
        return transformers.DeepseekV3Config(
            **_COMMON, **_MLA, num_hidden_layers=3, q_lora_rank=32, n_shared_experts=1, num_experts_per_tok=2, n_group=4,
            topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, rope_theta=10000.0,
            rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=128,
                              mscale=1.0, mscale_all_dim=0.8, beta_fast=32, beta_slow=1))
    if family == "qwen2_moe":
        return transformers.Qwen2MoeConfig(
            **_COMMON, num_hidden_layers=3, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=24, shared_expert_intermediate_size=48, norm_topk_prob=True,
            decoder_sparse_step=1, mlp_only_layers=[1], rope_theta=10000.0)
    if family == "llama":
        return transformers.LlamaConfig(
            **_COMMON, num_hidden_layers=2, num_key_value_heads=2, tie_word_embeddings=True,
            rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                   high_freq_factor=4.0, original_max_position_embeddings=64))
    raise ValueError(family)


_CLASSES = {"deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
            "qwen2_moe": "Qwen2MoeForCausalLM", "llama": "LlamaForCausalLM"}


def make_hf_model(family: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cls = getattr(transformers, _CLASSES[family])
    model = cls._from_config(hf_config(family), attn_implementation="eager")
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):   # HF inits it to 0: make it matter
                buf.uniform_(-0.05, 0.05)
    return model.eval()


def save_hf_model(model: torch.nn.Module, path: Path, max_shard_size: str | None = None) -> Path:
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(path, safe_serialization=True, **kwargs)
    return path


@torch.no_grad()
def hf_logits(model: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    """Full forward over the whole sequence: logits [L, V] float32."""
    return model(torch.tensor([token_ids])).logits[0].float()


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
