"""Triton MLA attention (absorbed form) over the paged latent KV cache: split-KV flash-decoding.

Legend: B = query rows (sequences in decode, new tokens in extend), N = query heads, C = kv_lora_rank,
R = rope dim, S = KV slots, L = KV length of a row, P = KV splits per row (num_kv_splits).

Versions (each validated against ref.py by tests/kernels/test_mla_attention.py):
  v1 (this file) stage 1: one program per (head block, split, row). The BLOCK_H heads of a program share
     every gathered latent tile -- all heads attend the same single latent "KV head" -- so one tile load
     feeds two tensor-core dots (q_nope.c_kv^T + q_rope.k_rope^T, then probs.c_kv); online softmax in base 2.
     The head block is grid axis 0, so programs that read the same latent rows run back to back and the
     re-reads of other head blocks mostly hit L2. Each split writes a normalised partial output and its
     log2-sum-exp; stage 2 merges the splits. With P == 1 stage 1 writes the final output directly.
     P is a runtime argument (only P == 1 vs P > 1 is compiled separately), so the split heuristic
     never triggers a recompile.
     KV ranges are given per row as (start, end) offsets into kv_indices, so the same kernel serves
     extend: every new token is a row whose range ends at its own causal position (correct, but it
     re-reads the prefix once per new token -- a fallback, not a prefill kernel).
Block sizes and split counts are swept by bench.py; default_config() / default_num_kv_splits() hold the
defaults (promote the sweep's winners there).
Must not import flashinfer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634
_MAX_GRID_YZ = 65535   # CUDA limit of grid axes 1 and 2


@dataclass(frozen=True)
class MLADecodeConfig:
    block_h: int = 16       # heads per program (tl.dot needs >= 16)
    block_n: int = 32       # latent rows per tile
    num_warps: int = 4
    num_stages: int = 2


def default_config(num_heads: int, kv_lora_rank: int) -> MLADecodeConfig:
    """Small tiles keep the [BLOCK_H, C] float32 accumulator in registers for C = 512."""
    return MLADecodeConfig(block_h=16, block_n=32 if kv_lora_rank <= 512 else 16)


def default_num_kv_splits(num_rows: int, num_head_blocks: int, device: torch.device,
                          max_splits: int = 64) -> int:
    """Enough programs for about two waves over the SMs. Depends only on shapes known on the host,
    never on KV lengths, so it needs no device sync and is CUDA-graph safe."""
    num_sms = (torch.cuda.get_device_properties(device).multi_processor_count
               if device.type == "cuda" else 4)
    programs = max(1, num_rows * num_head_blocks)
    return max(1, min(max_splits, triton.cdiv(2 * num_sms, programs)))


@triton.jit
def _mla_decode_stage1(
    q_nope_ptr, q_rope_ptr, ckv_ptr, kpe_ptr, kv_indices_ptr, kv_start_ptr, kv_end_ptr,
    out_ptr, mid_o_ptr, mid_lse_ptr,
    sm_scale_log2, num_heads,
    stride_qn_b, stride_qn_h, stride_qr_b, stride_qr_h,
    stride_ckv_s, stride_kpe_s,
    stride_o_b, stride_o_h,
    stride_mo_b, stride_mo_h, stride_mo_p,
    stride_ml_b, stride_ml_h,
    num_splits,
    C: tl.constexpr, R: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT_OUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_h = tl.program_id(0)
    pid_p = tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)      # row offsets can pass 2**31 elements in long extends

    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_c = tl.arange(0, BLOCK_C)
    offs_r = tl.arange(0, BLOCK_R)
    mask_h = offs_h < num_heads
    mask_c = offs_c < C
    mask_r = offs_r < R

    kv_start = tl.load(kv_start_ptr + pid_b)
    kv_len = tl.load(kv_end_ptr + pid_b) - kv_start
    split_len = tl.cdiv(kv_len, num_splits)
    lo = pid_p * split_len
    hi = tl.minimum(lo + split_len, kv_len)

    q_nope = tl.load(q_nope_ptr + pid_b * stride_qn_b + offs_h[:, None] * stride_qn_h + offs_c[None, :],
                     mask=mask_h[:, None] & mask_c[None, :], other=0.0)            # [BLOCK_H, BLOCK_C]
    q_rope = tl.load(q_rope_ptr + pid_b * stride_qr_b + offs_h[:, None] * stride_qr_h + offs_r[None, :],
                     mask=mask_h[:, None] & mask_r[None, :], other=0.0)            # [BLOCK_H, BLOCK_R]

    # padded head rows see q = 0 (finite scores), so no row is ever all -inf and no NaN appears
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        slots = tl.load(kv_indices_ptr + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)   # [BLOCK_N]
        c_kv = tl.load(ckv_ptr + slots[:, None] * stride_ckv_s + offs_c[None, :],
                       mask=mask_n[:, None] & mask_c[None, :], other=0.0)          # [BLOCK_N, BLOCK_C]
        k_pe = tl.load(kpe_ptr + slots[:, None] * stride_kpe_s + offs_r[None, :],
                       mask=mask_n[:, None] & mask_r[None, :], other=0.0)          # [BLOCK_N, BLOCK_R]
        qk = (tl.dot(q_nope, tl.trans(c_kv), input_precision=DOT_PRECISION)
              + tl.dot(q_rope, tl.trans(k_pe), input_precision=DOT_PRECISION))   # [BLOCK_H, BLOCK_N]
        qk = tl.where(mask_n[None, :], qk * sm_scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])                                           # [BLOCK_H, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c_kv.dtype), c_kv, input_precision=DOT_PRECISION)
        m_i = m_new

    has_kv = l_i > 0.0                       # false for an empty split (or an empty row)
    o = acc / tl.where(has_kv, l_i, 1.0)[:, None]
    mask_o = mask_h[:, None] & mask_c[None, :]
    if DIRECT_OUT:   # num_splits == 1: no stage 2
        tl.store(out_ptr + pid_b * stride_o_b + offs_h[:, None] * stride_o_h + offs_c[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=mask_o)
    else:
        lse = tl.where(has_kv, m_i + tl.log2(tl.where(has_kv, l_i, 1.0)), float("-inf"))   # [BLOCK_H]
        tl.store(mid_o_ptr + pid_b * stride_mo_b + offs_h[:, None] * stride_mo_h + pid_p * stride_mo_p
                 + offs_c[None, :], o, mask=mask_o)
        tl.store(mid_lse_ptr + pid_b * stride_ml_b + offs_h * stride_ml_h + pid_p, lse, mask=mask_h)


@triton.jit
def _mla_decode_stage2(
    mid_o_ptr, mid_lse_ptr, out_ptr,
    stride_mo_b, stride_mo_h, stride_mo_p,
    stride_ml_b, stride_ml_h,
    stride_o_b, stride_o_h,
    num_splits,
    C: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid_h = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    offs_c = tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    lse_base = mid_lse_ptr + pid_b * stride_ml_b + pid_h * stride_ml_h
    o_base = mid_o_ptr + pid_b * stride_mo_b + pid_h * stride_mo_h
    m = float("-inf")
    for p in range(num_splits):
        m = tl.maximum(m, tl.load(lse_base + p))
    m = tl.where(m == float("-inf"), 0.0, m)         # every split empty: all weights become 0
    acc = tl.zeros([BLOCK_C], tl.float32)
    den = 0.0
    for p in range(num_splits):
        w = tl.exp2(tl.load(lse_base + p) - m)       # empty split: lse = -inf, w = 0, its o = 0
        acc += w * tl.load(o_base + p * stride_mo_p + offs_c, mask=mask_c, other=0.0)   # [BLOCK_C]
        den += w
    out = acc / tl.where(den > 0.0, den, 1.0)
    tl.store(out_ptr + pid_b * stride_o_b + pid_h * stride_o_h + offs_c,
             out.to(out_ptr.dtype.element_ty), mask=mask_c)


def mla_attention_rows_triton(
    q_nope: torch.Tensor,      # [B, N, C]
    q_rope: torch.Tensor,      # [B, N, R]
    ckv: torch.Tensor,         # [S, C]  latent part of the pool (row stride free, last dim contiguous)
    kpe: torch.Tensor,         # [S, R]  rope part of the pool (may be a view into the same buffer as ckv)
    kv_start: torch.Tensor,    # [B] int, row b reads kv_indices[kv_start[b]:kv_end[b]]
    kv_end: torch.Tensor,      # [B] int
    kv_indices: torch.Tensor,  # [*] int slots
    sm_scale: float,
    num_kv_splits: int | None = None,
    config: MLADecodeConfig | None = None,
    out: torch.Tensor | None = None,   # [B, N, C] optional destination
) -> torch.Tensor:             # [B, N, C] in q_nope.dtype
    """Core launcher: every query row attends its own KV range. No host sync, CUDA-graph safe."""
    num_rows, num_heads, latent_dim = q_nope.shape
    rope_dim = q_rope.shape[-1]
    assert ckv.shape[-1] == latent_dim and kpe.shape[-1] == rope_dim, "q and cache dims differ"
    assert ckv.stride(-1) == 1 and kpe.stride(-1) == 1 and q_nope.stride(-1) == 1 and q_rope.stride(-1) == 1
    assert q_nope.dtype == ckv.dtype == kpe.dtype == q_rope.dtype, "tl.dot needs one dtype for q and KV"
    cfg = config or default_config(num_heads, latent_dim)
    if out is None:
        out = torch.empty(q_nope.shape, dtype=q_nope.dtype, device=q_nope.device)
    if num_rows == 0:
        return out
    num_head_blocks = triton.cdiv(num_heads, cfg.block_h)
    splits = num_kv_splits or default_num_kv_splits(num_rows, num_head_blocks, q_nope.device)
    assert 1 <= splits <= _MAX_GRID_YZ
    block_c = triton.next_power_of_2(latent_dim)
    block_r = max(16, triton.next_power_of_2(rope_dim))
    for row0 in range(0, num_rows, _MAX_GRID_YZ):     # one launch unless B > 65535 (long extend)
        rows = slice(row0, min(row0 + _MAX_GRID_YZ, num_rows))
        _launch_rows(q_nope[rows], q_rope[rows], ckv, kpe, kv_start[rows], kv_end[rows], kv_indices,
                     sm_scale, splits, cfg, out[rows], block_c, block_r, num_head_blocks)
    return out


def _launch_rows(q_nope, q_rope, ckv, kpe, kv_start, kv_end, kv_indices, sm_scale, splits, cfg, out,
                 block_c, block_r, num_head_blocks) -> None:
    num_rows, num_heads, latent_dim = q_nope.shape
    if splits > 1:
        mid_o = torch.empty((num_rows, num_heads, splits, latent_dim), dtype=torch.float32,
                            device=q_nope.device)                                  # [B, N, P, C]
        mid_lse = torch.empty((num_rows, num_heads, splits), dtype=torch.float32,
                              device=q_nope.device)                                # [B, N, P]
    else:   # stage 1 writes `out` directly; pass `out` as harmless stand-ins
        mid_o = out.unsqueeze(2)
        mid_lse = out[:, :, :1]
    _mla_decode_stage1[(num_head_blocks, splits, num_rows)](
        q_nope, q_rope, ckv, kpe, kv_indices, kv_start, kv_end,
        out, mid_o, mid_lse,
        sm_scale * _LOG2E, num_heads,
        q_nope.stride(0), q_nope.stride(1), q_rope.stride(0), q_rope.stride(1),
        ckv.stride(0), kpe.stride(0),
        out.stride(0), out.stride(1),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        splits,
        C=latent_dim, R=q_rope.shape[-1], BLOCK_C=block_c, BLOCK_R=block_r,
        BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, DIRECT_OUT=splits == 1,
        DOT_PRECISION="ieee" if q_nope.dtype == torch.float32 else "tf32",   # tf32 is ignored for 16-bit inputs
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if splits > 1:
        _mla_decode_stage2[(num_heads, num_rows)](
            mid_o, mid_lse, out,
            mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
            mid_lse.stride(0), mid_lse.stride(1),
            out.stride(0), out.stride(1),
            splits,
            C=latent_dim, BLOCK_C=block_c, num_warps=4,
        )


def split_latent_cache(kv_cache: torch.Tensor, latent_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[S, C + R] combined pool -> (ckv [S, C], kpe [S, R]) views, no copy."""
    return kv_cache[:, :latent_dim], kv_cache[:, latent_dim:]


def mla_decode_triton(
    q_nope: torch.Tensor,      # [B, N, C]
    q_rope: torch.Tensor,      # [B, N, R]
    kv_cache: torch.Tensor,    # [S, C + R]
    kv_indptr: torch.Tensor,   # [B + 1] int
    kv_indices: torch.Tensor,  # [sum L] int
    sm_scale: float,
    num_kv_splits: int | None = None,
    config: MLADecodeConfig | None = None,
) -> torch.Tensor:             # [B, N, C]
    """Drop-in for ref.mla_decode_ref (same signature and result, up to rounding)."""
    ckv, kpe = split_latent_cache(kv_cache, q_nope.shape[-1])
    return mla_attention_rows_triton(q_nope, q_rope, ckv, kpe, kv_indptr[:-1], kv_indptr[1:], kv_indices,
                                     sm_scale, num_kv_splits, config)


def extend_row_ranges(qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, num_tokens: int,
                      causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per new token (kv_start, kv_end) into kv_indices, bottom-right causal; [T] each. No host sync."""
    device = kv_indptr.device
    qo_indptr = qo_indptr.to(device=device, dtype=torch.int64)
    kv_indptr64 = kv_indptr.to(torch.int64)
    q_lens = qo_indptr[1:] - qo_indptr[:-1]                                        # [B]
    seq = torch.repeat_interleave(torch.arange(q_lens.numel(), device=device), q_lens,
                                  output_size=num_tokens)                           # [T]
    kv_start = kv_indptr64[seq]
    kv_end = kv_indptr64[seq + 1]
    if causal:
        pos = torch.arange(num_tokens, device=device) - qo_indptr[seq]              # [T] index among new tokens
        kv_end = kv_end - (q_lens[seq] - 1 - pos)
    return kv_start, kv_end


def mla_extend_triton(
    q_nope: torch.Tensor,      # [T, N, C]
    q_rope: torch.Tensor,      # [T, N, R]
    kv_cache: torch.Tensor,    # [S, C + R], new tokens already stored
    qo_indptr: torch.Tensor,   # [B + 1] int
    kv_indptr: torch.Tensor,   # [B + 1] int
    kv_indices: torch.Tensor,  # [sum L] int
    sm_scale: float,
    causal: bool = True,
    num_kv_splits: int | None = None,
    config: MLADecodeConfig | None = None,
) -> torch.Tensor:             # [T, N, C]
    """Drop-in for ref.mla_extend_ref. Fallback quality: O(T * L) KV reads (see module docstring)."""
    kv_start, kv_end = extend_row_ranges(qo_indptr, kv_indptr, q_nope.shape[0], causal)
    ckv, kpe = split_latent_cache(kv_cache, q_nope.shape[-1])
    return mla_attention_rows_triton(q_nope, q_rope, ckv, kpe, kv_start, kv_end, kv_indices, sm_scale,
                                     num_kv_splits, config)


__all__ = [
    "MLADecodeConfig", "default_config", "default_num_kv_splits", "mla_attention_rows_triton",
    "mla_decode_triton", "mla_extend_triton", "extend_row_ranges", "split_latent_cache",
]
