"""Fused MoE expert computation on Triton (SGLang/vLLM's fused_moe): align, gate_up GEMM with the SiLU
epilogue, down GEMM with the routing weight, sum over top-k. Matches ref.fused_moe_ref.

Legend: M = tokens, H = hidden, I = intermediate size per shard, E = experts, K = top-k, S = M*K slots.
Launches: align (3) -> [fp8: quant hidden] -> gate_up (v2 gated epilogue; v1: GEMM + silu_and_mul)
-> [fp8: quant act] -> down (x topk weight) -> sum over K (combine.topk_sum).
No host sync, so the whole call can be captured in a CUDA graph. Shared experts stacked after the routed
ones (runtime.models.moe.MoE.fuse_shared_experts) are just more experts and pairs; `config_shape` then
names the routed (E, K) whose tuned table the launch config comes from.
Expert parallelism: a topk id of -1 (align.SKIP_EXPERT) marks a pair of an expert another rank holds.
It gets no GEMM row (the align step leaves it out, so the GEMMs run only this rank's pairs; the buffers
keep their worst-case sizes) and the sum skips it, so the output is this rank's share of the top-k sum.
"""
from __future__ import annotations

import torch
import triton

from kernels.small_ops.triton_act import silu_and_mul_triton as silu_and_mul
from kernels.fused_moe.align import moe_align_block_size
from kernels.fused_moe.combine import topk_sum
from kernels.fused_moe.config import FP8_GROUP, dtype_name, fit_config, get_config, split_config
from kernels.fused_moe.gemm import invoke_moe_gemm
from kernels.fused_moe.quant import FP8_DTYPE, per_token_group_quant_fp8


def fused_moe(
    hidden: torch.Tensor,        # [M, H] bf16/fp16/fp32
    w13: torch.Tensor,           # [E, 2I, H] gate rows then up rows; same dtype as hidden, or fp8
    w2: torch.Tensor,            # [E, H, I]
    topk_weights: torch.Tensor,  # [M, K] float
    topk_ids: torch.Tensor,      # [M, K] int32/int64 in [0, E), or -1: a pair to skip (another EP rank's)
    *,
    config: dict | None = None,        # launch config (config.py); None = tuned table or heuristic
    inplace: bool = False,             # write the result into `hidden`
    w13_scale: torch.Tensor | None = None,  # fp8 only: [E, 2I/128, H/128] float32
    w2_scale: torch.Tensor | None = None,   # fp8 only: [E, H/128, I/128] float32
    fuse_silu: bool = True,            # False = v1 (separate silu_and_mul launch), for comparison
    config_shape: tuple[int, int] | None = None,  # (E, K) the launch config is looked up for; None = these
) -> torch.Tensor:                     # [M, H] hidden.dtype
    num_tokens, hidden_size = hidden.shape
    num_experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    top_k = topk_ids.shape[1]
    use_fp8 = FP8_DTYPE is not None and w13.dtype == FP8_DTYPE
    _check_shapes(hidden, w13, w2, topk_weights, topk_ids, use_fp8, w13_scale, w2_scale)
    out = hidden if inplace else torch.empty_like(hidden)
    if num_tokens == 0:
        return out
    if config is None:
        table_experts, table_top_k = config_shape or (num_experts, top_k)
        config = get_config(num_tokens, table_experts, table_top_k, inter, dtype_name(w13.dtype))
    gate_up_cfg, down_cfg = split_config(config)
    a_bytes, w_bytes = (1, 1) if use_fp8 else (hidden.element_size(), w13.element_size())
    gate_up_cfg = fit_config(gate_up_cfg, a_bytes, w_bytes, gated=fuse_silu, use_fp8=use_fp8)
    down_cfg = fit_config(down_cfg, a_bytes, w_bytes, gated=False, use_fp8=use_fp8)
    routing = moe_align_block_size(topk_ids, gate_up_cfg["BLOCK_SIZE_M"], num_experts)
    num_slots = num_tokens * top_k

    a1, a1_scale = per_token_group_quant_fp8(hidden) if use_fp8 else (hidden, None)
    act = torch.empty(num_slots, inter, dtype=hidden.dtype, device=hidden.device)      # [S, I]
    if fuse_silu:
        invoke_moe_gemm(a1, w13, act, routing, gate_up_cfg, num_valid_slots=num_slots, a_row_divisor=top_k,
                        gated=True, a_scale=a1_scale, b_scale=w13_scale)
    else:
        gate_up = torch.empty(num_slots, two_inter, dtype=hidden.dtype, device=hidden.device)  # [S, 2I]
        invoke_moe_gemm(a1, w13, gate_up, routing, gate_up_cfg, num_valid_slots=num_slots,
                        a_row_divisor=top_k, a_scale=a1_scale, b_scale=w13_scale)
        silu_and_mul(gate_up, out=act)

    a2, a2_scale = per_token_group_quant_fp8(act) if use_fp8 else (act, None)
    down = torch.empty(num_slots, hidden_size, dtype=hidden.dtype, device=hidden.device)   # [S, H]
    invoke_moe_gemm(a2, w2, down, routing, down_cfg, num_valid_slots=num_slots, a_row_divisor=1,
                    topk_weights=topk_weights.reshape(-1), a_scale=a2_scale, b_scale=w2_scale)
    return topk_sum(down, topk_ids, out)   # rows of skipped pairs were never written: not read


def _check_shapes(hidden, w13, w2, topk_weights, topk_ids, use_fp8, w13_scale, w2_scale) -> None:
    num_tokens, hidden_size = hidden.shape
    num_experts, two_inter, w13_hidden = w13.shape
    assert two_inter % 2 == 0 and w13_hidden == hidden_size, (hidden.shape, w13.shape)
    assert w2.shape == (num_experts, hidden_size, two_inter // 2), (w13.shape, w2.shape)
    assert topk_ids.shape == topk_weights.shape and topk_ids.shape[0] == num_tokens
    assert w2.dtype == w13.dtype
    if use_fp8:
        assert w13_scale is not None and w2_scale is not None, "fp8 weights need w13_scale and w2_scale"
        assert hidden.dtype in (torch.bfloat16, torch.float16, torch.float32)
        h_blocks, i_blocks = triton.cdiv(hidden_size, FP8_GROUP), triton.cdiv(two_inter // 2, FP8_GROUP)
        assert w13_scale.shape == (num_experts, triton.cdiv(two_inter, FP8_GROUP), h_blocks), w13_scale.shape
        assert w2_scale.shape == (num_experts, h_blocks, i_blocks), w2_scale.shape
    else:
        assert w13_scale is None and w2_scale is None
        assert hidden.dtype == w13.dtype, (hidden.dtype, w13.dtype)
