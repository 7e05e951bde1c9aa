"""Llama (2/3/3.1): dense GQA decoder, optional llama3 rope scaling, optional attention/MLP bias."""
from __future__ import annotations

from runtime.models.attention import Attention
from runtime.models.base import GATE_UP_STACKED, QKV_STACKED, CausalLM, DecoderLayer
from runtime.models.layers import GatedMLP


class LlamaForCausalLM(CausalLM):
    stacked_params = QKV_STACKED + GATE_UP_STACKED

    def make_layer(self, layer_id: int) -> DecoderLayer:
        cfg, dtype, device = self.config, self.dtype, self.device
        attn = Attention(cfg, layer_id, dtype, device, self.parallel)
        mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, dtype, device, self.parallel)
        return DecoderLayer(attn, mlp, cfg, dtype, device, self.parallel)
