"""DeepSeek-V2, V2-Lite and V3: MLA attention, dense MLP in the first layers, then MoE with shared experts.

V3's differences (q LoRA, sigmoid + noaux_tc routing with e_score_correction_bias, YaRN) are config.
"""
from __future__ import annotations

from runtime.models.base import GATE_UP_STACKED, CausalLM, DecoderLayer
from runtime.models.layers import GatedMLP
from runtime.models.mla import MLAttention
from runtime.models.moe import MoE


class DeepseekV2ForCausalLM(CausalLM):
    stacked_params = GATE_UP_STACKED

    def make_layer(self, layer_id: int) -> DecoderLayer:
        cfg, dtype, device = self.config, self.dtype, self.device
        # DP attention: heads split over the attention TP group only (each attention rank its own requests)
        attn = MLAttention(cfg, layer_id, dtype, device, self.parallel.attention_parallel)
        if cfg.is_moe_layer(layer_id):
            mlp = MoE(cfg, dtype, device, parallel=self.parallel)
        else:
            mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, dtype, device, self.parallel)
        return DecoderLayer(attn, mlp, cfg, dtype, device, self.parallel)


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """Same modules; the MTP layer (model.layers.{num_hidden_layers}) of V3 checkpoints is skipped."""
