"""Qwen2-MoE (Qwen1.5-MoE): GQA attention with q/k/v bias; MoE layers (softmax top-k) with a
sigmoid-gated shared expert, dense MLP on mlp_only_layers or off the decoder_sparse_step."""
from __future__ import annotations

from runtime.models.attention import Attention
from runtime.models.base import GATE_UP_STACKED, QKV_STACKED, CausalLM, DecoderLayer
from runtime.models.layers import GatedMLP
from runtime.models.moe import MoE

class Qwen2MoeForCausalLM(CausalLM):
    stacked_params = QKV_STACKED + GATE_UP_STACKED

    def make_layer(self, layer_id: int) -> DecoderLayer:
        cfg, dtype, device = self.config, self.dtype, self.device
        attn = Attention(cfg, layer_id, dtype, device, self.parallel)
        if cfg.is_moe_layer(layer_id):
            mlp = MoE(cfg, dtype, device, parallel=self.parallel)
        else:
            mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, False, dtype, device, self.parallel)
        return DecoderLayer(attn, mlp, cfg, dtype, device, self.parallel)
