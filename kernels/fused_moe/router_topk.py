"""MoE router and greedy top-k in two launches, for the few-token steps where launches dominate (decode):
float32 logits of each token against the router rows, softmax or sigmoid scores, greedy top-k weighted
by the scores (optionally renormalised, then scaled), and S shared-expert pairs appended after the top-k
(ids E..E+S-1) for a fused MoE that computes shared experts as experts: weight 1 (DeepSeek), or the
sigmoid of one extra gate row of the router weight (Qwen2-MoE's shared_expert_gate).

Legend: T = tokens, H = hidden, E = routed experts, G = gate rows after them (0 or 1), K = top-k,
S = shared experts appended, KS = K + S. Launch 1, grid (T, (E + G) / 4): float32 logits, each program
four whole router rows of one token (the weight is read once per token, L2-resident across tokens, so
callers use it up to a few dozen tokens). Launch 2, grid (T): scores, top-k and the shared pairs.
(One program per token for both streamed the whole weight through one SM: ~4x slower at batch 1.)
Replaces the float cast, the router GEMM, softmax, top-k, the weight gather and the shared-expert
column concatenation (six to eight launches). Matches runtime.models.moe.select_experts (greedy
routing) up to float32 summation order; ties between equal scores may pick a different expert.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 256              # E + G the top-k program holds in one tile
ROWS_PER_PROGRAM = 4        # router rows per logits program: a token's logits spread over (E + G) / 4 SMs
LOGITS_TILE_ELEMENTS = 4096 # rows x hidden columns one logits program loads per loop step


@triton.jit
def _router_logits_kernel(
    x_ptr, w_ptr, logits_ptr,
    hidden, num_rows, stride_xt, stride_we, stride_lt,
    BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """Program (t, j): logits[t, j*BE:(j+1)*BE] = x[t] . w[rows] in float32 (whole rows: no split-K, so every
    logit is one deterministic sum)."""
    token = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)                    # [BE]
    acc = tl.zeros([BLOCK_E], dtype=tl.float32)
    for start in range(0, hidden, BLOCK_H):
        cols = start + tl.arange(0, BLOCK_H)                                       # [BH]
        x = tl.load(x_ptr + token * stride_xt + cols, mask=cols < hidden, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + rows[:, None] * stride_we + cols[None, :],
                    mask=(rows[:, None] < num_rows) & (cols[None, :] < hidden), other=0.0).to(tl.float32)
        acc += tl.sum(w * x[None, :], axis=1)                                      # [BE]
    tl.store(logits_ptr + token * stride_lt + rows, acc, mask=rows < num_rows)


@triton.jit
def _topk_kernel(
    logits_ptr, weights_ptr, ids_ptr,
    num_experts, stride_lt, stride_ot, scaling,
    ROWS_POW2: tl.constexpr, TOP_K: tl.constexpr, KS_POW2: tl.constexpr,
    NUM_SHARED: tl.constexpr, GATE_ROW: tl.constexpr, SIGMOID: tl.constexpr, RENORM: tl.constexpr,
):
    """Program t: the top-k of the scores of logits[t, :E]; outputs [KS] = top-k (id, weight) then the S
    shared pairs (weight 1, or the sigmoid of logits[t, E])."""
    token = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, ROWS_POW2)                                                 # [R]
    acc = tl.load(logits_ptr + token * stride_lt + rows, mask=rows < num_experts + GATE_ROW, other=0.0)
    routed = rows < num_experts
    if SIGMOID:
        scores = 1.0 / (1.0 + tl.exp(-acc))
    else:
        top = tl.max(tl.where(routed, acc, float("-inf")), axis=0)
        expo = tl.where(routed, tl.exp(acc - top), 0.0)
        scores = expo / tl.sum(expo, axis=0)
    choice = tl.where(routed, scores, float("-inf"))
    slots = tl.arange(0, KS_POW2)                                                  # [KS]
    out_ids = tl.zeros([KS_POW2], dtype=tl.int32)
    out_w = tl.zeros([KS_POW2], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        best = tl.argmax(choice, axis=0)
        weight = tl.sum(tl.where(rows == best, scores, 0.0), axis=0)
        out_ids = tl.where(slots == k, best.to(tl.int32), out_ids)
        out_w = tl.where(slots == k, weight, out_w)
        choice = tl.where(rows == best, float("-inf"), choice)
    if RENORM:
        out_w = out_w / (tl.sum(out_w, axis=0) + 1e-20)                            # only the K top-k slots are set
    out_w = out_w * scaling
    if NUM_SHARED > 0:
        if GATE_ROW:
            gate = tl.sum(tl.where(rows == num_experts, acc, 0.0), axis=0)
            shared_w = 1.0 / (1.0 + tl.exp(-gate))
        else:
            shared_w = 1.0
        is_shared = (slots >= TOP_K) & (slots < TOP_K + NUM_SHARED)
        out_ids = tl.where(is_shared, num_experts + slots - TOP_K, out_ids)
        out_w = tl.where(is_shared, shared_w, out_w)
    keep = slots < TOP_K + NUM_SHARED
    tl.store(ids_ptr + token * stride_ot + slots, out_ids, mask=keep)
    tl.store(weights_ptr + token * stride_ot + slots, out_w, mask=keep)


def router_topk(
    x: torch.Tensor,              # [T, H] rows contiguous
    weight: torch.Tensor,         # [E + G, H] router rows (any float dtype; products taken in float32)
    num_experts: int,             # E
    top_k: int,                   # K
    *,
    scoring_func: str = "softmax",   # softmax | sigmoid
    norm_topk_prob: bool = False,
    routed_scaling_factor: float = 1.0,
    num_shared: int = 0,          # S pairs appended, ids E..E+S-1
    gate_row: bool = False,       # `weight` has a gate row E: its logit is returned; the S pairs weigh its sigmoid (else 1)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> topk_weights [T, K + S] float32, topk_ids [T, K + S] int32, logits [T, E + G] float32 (the gate row's
    logit is the last column when G = 1)."""
    num_tokens, hidden = x.shape
    num_rows = num_experts + (1 if gate_row else 0)
    assert weight.shape == (num_rows, hidden), (weight.shape, num_rows, hidden)
    assert x.stride(1) == 1 and weight.stride(1) == 1
    assert scoring_func in ("softmax", "sigmoid"), scoring_func
    assert 0 < top_k <= num_experts <= num_rows <= MAX_ROWS
    width = top_k + num_shared
    weights = torch.empty(num_tokens, width, dtype=torch.float32, device=x.device)
    ids = torch.empty(num_tokens, width, dtype=torch.int32, device=x.device)
    logits = torch.empty(num_tokens, num_rows, dtype=torch.float32, device=x.device)   # [T, E + G]
    if num_tokens == 0:
        return weights, ids, logits
    block_h = min(triton.next_power_of_2(hidden), LOGITS_TILE_ELEMENTS // ROWS_PER_PROGRAM)
    _router_logits_kernel[(num_tokens, triton.cdiv(num_rows, ROWS_PER_PROGRAM))](
        x, weight, logits, hidden, num_rows, x.stride(0), weight.stride(0), num_rows,
        BLOCK_E=ROWS_PER_PROGRAM, BLOCK_H=block_h, num_warps=4)
    _topk_kernel[(num_tokens,)](
        logits, weights, ids, num_experts, num_rows, width, float(routed_scaling_factor),
        ROWS_POW2=triton.next_power_of_2(num_rows), TOP_K=top_k, KS_POW2=triton.next_power_of_2(width),
        NUM_SHARED=num_shared, GATE_ROW=gate_row, SIGMOID=scoring_func == "sigmoid",
        RENORM=norm_topk_prob, num_warps=1)
    return weights, ids, logits
