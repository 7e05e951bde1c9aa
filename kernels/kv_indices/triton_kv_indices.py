"""Builds FlashInfer-style `kv_indices` on the device from the request->slot table (SGLang's
create_flashinfer_kv_indices_triton): sequence b's KV slots are table[rows[b], 0:seq_lens[b]].

Legend: B = sequences, K = sum of seq_lens, R = table rows, L = table columns (max context).
Also runs under TRITON_INTERPRET=1 (CPU tests); `kv_indices_torch` is the reference.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK_TOKENS = 4096   # tokens of one sequence handled by one program


@triton.jit
def _kv_indices_kernel(table_ptr, table_stride, rows_ptr, kv_indptr_ptr, out_ptr,
                       CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    seq = tl.program_id(0)
    chunk = tl.program_id(1)
    row = tl.load(rows_ptr + seq).to(tl.int64)
    start = tl.load(kv_indptr_ptr + seq)
    length = tl.load(kv_indptr_ptr + seq + 1) - start
    first = chunk * CHUNK
    for offset in range(0, CHUNK, BLOCK):
        pos = first + offset + tl.arange(0, BLOCK)
        mask = pos < length
        slots = tl.load(table_ptr + row * table_stride + pos, mask=mask)
        tl.store(out_ptr + start + pos, slots, mask=mask)


def kv_indices_triton(table: torch.Tensor, rows: torch.Tensor, kv_indptr: torch.Tensor,
                      num_kv_tokens: int, max_seq_len: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """table [R, L] int32; rows [B] (any int dtype); kv_indptr [B + 1] int32 -> kv_indices [K] int32.
    `num_kv_tokens` (K) and `max_seq_len` are host-known, so nothing syncs."""
    num_seqs = rows.shape[0]
    if out is None:
        out = torch.empty(num_kv_tokens, dtype=torch.int32, device=table.device)
    if num_seqs == 0 or num_kv_tokens == 0:
        return out[:num_kv_tokens]
    grid = (num_seqs, triton.cdiv(max_seq_len, CHUNK_TOKENS))
    _kv_indices_kernel[grid](table, table.stride(0), rows, kv_indptr, out, CHUNK=CHUNK_TOKENS, BLOCK=512)
    return out[:num_kv_tokens]


def kv_indices_torch(table: torch.Tensor, rows: torch.Tensor, kv_indptr: torch.Tensor,
                     num_kv_tokens: int) -> torch.Tensor:
    """The same gather in torch ops (CPU path and reference); no host sync either."""
    lengths = (kv_indptr[1:] - kv_indptr[:-1]).long()                                  # [B]
    seq_of_token = torch.repeat_interleave(torch.arange(rows.shape[0], device=table.device), lengths,
                                           output_size=num_kv_tokens)                  # [K]
    pos = torch.arange(num_kv_tokens, device=table.device) - kv_indptr[:-1].long()[seq_of_token]
    return table[rows.long()[seq_of_token], pos]
