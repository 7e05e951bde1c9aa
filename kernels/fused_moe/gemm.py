"""Grouped GEMM over expert-sorted tokens: the Triton kernel behind both MoE matmuls, and its launcher.

Legend: M = tokens, K = top-k, E = experts, H = hidden, I = intermediate size, S = M*K routed slots,
N = output columns of this GEMM, D = its reduction length (H for gate_up, I for down; "D" so that
"K" keeps meaning top-k), BM/BN/BK = block sizes, EM = capacity of sorted_token_ids.

One program computes a [BM, BN] tile of out[slot, :] = A[row(slot)] @ B[expert].T for the BM slots of
one aligned block (all routed to one expert; sentinel rows are masked). B is stored [E, N, D] (nn.Linear
layout) so a [BK, BN] tile of B.T reads D-contiguous rows. The grid covers the worst-case EM rows (a
static shape for CUDA graphs); programs past num_tokens_post_padded return before any load, so pairs the
align step left out (expert parallelism: other ranks' experts) cost only those early exits, and
their output rows are never written.

Versions:
  v1 plain tile (GATED=False): gate_up writes [S, 2I], a separate silu_and_mul launch makes [S, I].
  v2 gated epilogue (GATED=True): the program loads the gate rows j and the up rows I+j of w13 against
     the same A tile, keeps two accumulators and writes silu(gate) * up directly: one launch and no
     [S, 2I] round trip through HBM. Promoted; v1 stays for comparison (fused_moe(fuse_silu=False)).
  Both: MUL_ROUTED_WEIGHT scales rows by their top-k weight in the epilogue (down GEMM); USE_FP8 runs
     fp8 x fp8 dots and applies per-token-group activation scales [rows, D/128] and 128x128 block
     weight scales [E, N/128, D/128] after each BK step (BK divides 128); GROUP_SIZE_M orders programs
     so consecutive ones share a B tile while it sits in L2; expert and row offsets are int64.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.fused_moe.align import AlignedRouting
from kernels.fused_moe.config import FP8_GROUP


@triton.jit
def _mma(acc, a, b, a_s, b_s, USE_FP8: tl.constexpr, DOT_IEEE: tl.constexpr):
    if USE_FP8:
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
    elif DOT_IEEE:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit(do_not_specialize=["em", "num_valid_slots"])
def _moe_gemm_kernel(
    a_ptr, b_ptr, c_ptr, a_scale_ptr, b_scale_ptr, topk_weights_ptr,
    sorted_token_ids_ptr, expert_ids_ptr, num_tokens_post_padded_ptr,
    size_n, size_d, em, num_valid_slots, up_row_offset,
    stride_am, stride_ad, stride_be, stride_bn, stride_bd, stride_cm, stride_cn,
    stride_asm, stride_asd, stride_bse, stride_bsn, stride_bsd,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, A_ROW_DIVISOR: tl.constexpr, GATED: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr, USE_FP8: tl.constexpr, EVEN_D: tl.constexpr,
    DOT_IEEE: tl.constexpr, QUANT_GROUP: tl.constexpr,
):
    # program -> (pid_m, pid_n), GROUP_SIZE_M row-blocks at a time
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(em, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(size_n, BLOCK_SIZE_N)
    pids_per_group = GROUP_SIZE_M * num_pid_n
    first_pid_m = (pid // pids_per_group) * GROUP_SIZE_M
    group_rows = tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + (pid % pids_per_group) % group_rows
    pid_n = (pid % pids_per_group) // group_rows
    if pid_m * BLOCK_SIZE_M >= tl.load(num_tokens_post_padded_ptr):
        return  # a block past the used length (EM is only an upper bound)

    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    slots = tl.load(sorted_token_ids_ptr + offs_m)                       # [BM] t*K+k or sentinel
    slot_mask = slots < num_valid_slots
    a_rows = (slots // A_ROW_DIVISOR).to(tl.int64)                       # [BM] token (gate_up) or slot (down)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_bn = offs_n % size_n   # wrap columns past N onto real rows: loads stay in bounds, stores are masked
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ad          # [BM, BK]
    b_ptrs = b_ptr + expert * stride_be + offs_bn[None, :] * stride_bn + offs_k[:, None] * stride_bd  # [BK, BN]
    up_ptrs = b_ptrs + up_row_offset * stride_bn
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    if USE_FP8:
        a_scale_ptrs = a_scale_ptr + a_rows * stride_asm                                # [BM]
        b_scale_base = b_scale_ptr + expert * stride_bse
        b_scale_ptrs = b_scale_base + (offs_bn // QUANT_GROUP) * stride_bsn                            # [BN]
        b_up_scale_ptrs = b_scale_base + ((offs_bn + up_row_offset) // QUANT_GROUP) * stride_bsn       # [BN]

    for k_step in range(0, tl.cdiv(size_d, BLOCK_SIZE_K)):
        if EVEN_D:
            a = tl.load(a_ptrs, mask=slot_mask[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            d_left = size_d - k_step * BLOCK_SIZE_K
            a = tl.load(a_ptrs, mask=slot_mask[:, None] & (offs_k[None, :] < d_left), other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < d_left, other=0.0)
        group = (k_step * BLOCK_SIZE_K) // QUANT_GROUP   # fp8 scale column of this K step
        if USE_FP8:
            a_s = tl.load(a_scale_ptrs + group * stride_asd, mask=slot_mask, other=0.0)   # [BM]
            b_s = tl.load(b_scale_ptrs + group * stride_bsd)                               # [BN]
        else:
            a_s = 1.0
            b_s = 1.0
        acc = _mma(acc, a, b, a_s, b_s, USE_FP8, DOT_IEEE)
        if GATED:
            if EVEN_D:
                b_up = tl.load(up_ptrs)
            else:
                b_up = tl.load(up_ptrs, mask=offs_k[:, None] < size_d - k_step * BLOCK_SIZE_K, other=0.0)
            if USE_FP8:
                b_up_s = tl.load(b_up_scale_ptrs + group * stride_bsd)
            else:
                b_up_s = 1.0
            acc_up = _mma(acc_up, a, b_up, a_s, b_up_s, USE_FP8, DOT_IEEE)
            up_ptrs += BLOCK_SIZE_K * stride_bd
        a_ptrs += BLOCK_SIZE_K * stride_ad
        b_ptrs += BLOCK_SIZE_K * stride_bd

    if GATED:
        acc = acc * tl.sigmoid(acc) * acc_up                                 # silu(gate) * up, fp32
    if MUL_ROUTED_WEIGHT:
        weight = tl.load(topk_weights_ptr + slots, mask=slot_mask, other=0.0)
        acc = acc * weight[:, None].to(tl.float32)
    c_ptrs = c_ptr + slots.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=slot_mask[:, None] & (offs_n[None, :] < size_n))


def invoke_moe_gemm(
    a: torch.Tensor,                  # [M, D] hidden (A_ROW_DIVISOR = K) or [S, D] activations (divisor 1)
    b: torch.Tensor,                  # [E, N, D], or [E, 2N, D] gate rows then up rows when gated
    out: torch.Tensor,                # [S, N] row = slot t*K+k
    routing: AlignedRouting,
    config: dict,
    *,
    num_valid_slots: int,
    a_row_divisor: int,
    gated: bool = False,
    topk_weights: torch.Tensor | None = None,  # [S] multiplies output rows when given
    a_scale: torch.Tensor | None = None,       # [rows of a, D/128] fp8 activation scales
    b_scale: torch.Tensor | None = None,       # [E, rows of b / 128, D/128] fp8 weight scales
) -> torch.Tensor:
    """Launch one grouped GEMM; `config` must already be fitted (config.fit_config)."""
    size_d = a.shape[1]
    size_n = b.shape[1] // 2 if gated else b.shape[1]
    assert b.shape[2] == size_d and out.shape[1] == size_n, (a.shape, b.shape, out.shape)
    use_fp8 = b_scale is not None
    em = routing.sorted_token_ids.numel()
    bm, bn, bk = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    grid = (triton.cdiv(em, bm) * triton.cdiv(size_n, bn),)
    a_scale_t = a_scale if use_fp8 else a    # placeholders: never read unless USE_FP8
    b_scale_t = b_scale if use_fp8 else b
    _moe_gemm_kernel[grid](
        a, b, out, a_scale_t, b_scale_t, topk_weights if topk_weights is not None else a,
        routing.sorted_token_ids, routing.expert_ids, routing.num_tokens_post_padded,
        size_n, size_d, em, num_valid_slots, size_n if gated else 0,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2), out.stride(0), out.stride(1),
        a_scale_t.stride(0) if use_fp8 else 0, a_scale_t.stride(1) if use_fp8 else 0,
        b_scale_t.stride(0) if use_fp8 else 0, b_scale_t.stride(1) if use_fp8 else 0,
        b_scale_t.stride(2) if use_fp8 else 0,
        BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=config["GROUP_SIZE_M"],
        A_ROW_DIVISOR=a_row_divisor, GATED=gated, MUL_ROUTED_WEIGHT=topk_weights is not None,
        USE_FP8=use_fp8, EVEN_D=size_d % bk == 0, DOT_IEEE=a.dtype == torch.float32,
        QUANT_GROUP=FP8_GROUP, num_warps=config["num_warps"], num_stages=config["num_stages"],
    )
    return out
