"""Paged KV pools addressed by integer slot indices (the slots the core's allocator hands out).

Legend: S = slots, Hkv = KV heads, D = key head dim, Dv = value head dim, C = kv_lora_rank, R = rope dim.
num_slots comes from the core's KV capacity; the pool adds nothing (slot 0 is an ordinary slot).
"""
from __future__ import annotations

import torch

from runtime.models.config import ModelConfig


class MHAKVPool:
    """Per layer a key buffer [S, Hkv, D] and a value buffer [S, Hkv, Dv]."""

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 v_head_dim: int, dtype: torch.dtype, device: torch.device | str):
        self.num_layers, self.num_slots, self.dtype = num_layers, num_slots, dtype
        self.num_kv_heads, self.head_dim, self.v_head_dim = num_kv_heads, head_dim, v_head_dim
        self.k_buffers = [torch.zeros(num_slots, num_kv_heads, head_dim, dtype=dtype, device=device)
                          for _ in range(num_layers)]
        self.v_buffers = [torch.zeros(num_slots, num_kv_heads, v_head_dim, dtype=dtype, device=device)
                          for _ in range(num_layers)]

    def write(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """loc [T] slots; k [T, Hkv, D], v [T, Hkv, Dv]. Mutates layer `layer` only."""
        self.k_buffers[layer][loc] = k.to(self.dtype)
        self.v_buffers[layer][loc] = v.to(self.dtype)

    def get_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffers[layer], self.v_buffers[layer]

    def bytes_per_token(self) -> int:
        """KV bytes one token occupies over all layers."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return self.num_layers * self.num_kv_heads * (self.head_dim + self.v_head_dim) * elem


class MLAKVPool:
    """Per layer one latent buffer [S, C + R]: the normed c_kv, then the roped k_pe."""

    def __init__(self, num_layers: int, num_slots: int, kv_lora_rank: int, rope_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        self.num_layers, self.num_slots, self.dtype = num_layers, num_slots, dtype
        self.kv_lora_rank, self.rope_dim = kv_lora_rank, rope_dim
        self.kv_buffers = [torch.zeros(num_slots, kv_lora_rank + rope_dim, dtype=dtype, device=device)
                           for _ in range(num_layers)]

    def write(self, layer: int, loc: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor) -> None:
        """loc [T] slots; c_kv [T, C], k_pe [T, R]. Mutates layer `layer` only."""
        buf = self.kv_buffers[layer]
        buf[loc, :self.kv_lora_rank] = c_kv.to(self.dtype)
        buf[loc, self.kv_lora_rank:] = k_pe.to(self.dtype)

    def get_kv(self, layer: int) -> torch.Tensor:
        return self.kv_buffers[layer]

    def bytes_per_token(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return self.num_layers * (self.kv_lora_rank + self.rope_dim) * elem


KVPool = MHAKVPool | MLAKVPool


def create_kv_pool(config: ModelConfig, num_slots: int, dtype: torch.dtype,
                   device: torch.device | str, num_layers: int | None = None) -> KVPool:
    """The pool kind the model family needs (MLA latent for DeepSeek, MHA/GQA otherwise)."""
    layers = config.num_hidden_layers if num_layers is None else num_layers
    if config.use_mla:
        return MLAKVPool(layers, num_slots, config.kv_lora_rank, config.qk_rope_head_dim, dtype, device)
    return MHAKVPool(layers, num_slots, config.num_key_value_heads, config.head_dim, config.head_dim,
                     dtype, device)
