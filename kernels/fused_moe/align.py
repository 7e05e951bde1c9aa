"""Group routed tokens by expert in BM-row blocks for the grouped MoE GEMM (SGLang's moe_align_block_size).

Legend: M = tokens, K = top-k, E = experts, BM = block size (rows of one GEMM tile), P = align programs,
EM = capacity of sorted_token_ids (a bound the host knows, so nothing here waits for the device).

Contract, identical for both versions (bit for bit):
  topk_ids [M, K]              expert ids in [0, E), or SKIP_EXPERT (-1; any negative id) for a pair this
                               call must not compute (expert parallelism: an expert another rank holds).
  sorted_token_ids [EM] int32  flat indices t*K+k grouped by expert in ascending expert order, stable
                               within an expert; each group padded with the sentinel M*K to a multiple of
                               BM; the unused tail is all sentinel. Skipped pairs appear nowhere.
  expert_ids [EM/BM] int32     the expert of every block; -1 for blocks past num_tokens_post_padded.
  num_tokens_post_padded [1]   int32, the used length of sorted_token_ids (a multiple of BM); it counts
                               only the pairs to compute, so the GEMMs' blocks past it exit at once.
  Experts without tokens get no block. EM stays the worst case of M*K pairs (static shapes for graphs).

Sizes that change with the step's tokens are not specialised on (do_not_specialize): Triton would otherwise
compile another variant when one first turns (not) divisible by 16 -- inside a serving step, ~0.5 s (seen on
an H200 at a 6,787-token prefill the warm-up had not covered).

Versions:
  v1 moe_align_block_size_torch: argsort + searchsorted, about ten small torch launches; the oracle.
  v2 moe_align_block_size: three Triton launches -- per-chunk expert histograms (and the sentinel
     fill), one program for the prefix sums and expert_ids, per-chunk stable scatter. Fewer launches
     matter at decode sizes, where the whole MoE layer takes tens of microseconds: up to
     SMALL_TILE_ELEMENTS slot x expert pairs (decode batches of a few dozen tokens) one program does all
     three in one launch.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

SUB_ROWS = 64         # flat slots one align program handles per loop step
MAX_PROGRAMS = 64     # chunk programs in v2; the prefix program holds a [P, E] tile
FILL_BLOCK = 1024     # sentinel stores per loop step
BLOCKS_PER_STEP = 64  # expert_ids written per loop step
SKIP_EXPERT = -1      # topk id of a pair to leave out (SGLang's id for an expert off this EP rank)
SMALL_TILE_ELEMENTS = 16384  # slots x experts (powers of two) up to which one program aligns everything


class AlignedRouting(NamedTuple):
    sorted_token_ids: torch.Tensor        # [EM] int32
    expert_ids: torch.Tensor              # [EM / BM] int32
    num_tokens_post_padded: torch.Tensor  # [1] int32


def padded_capacity(num_slots: int, block_size: int, num_experts: int) -> int:
    """EM: at most min(E, M*K) experts hold tokens and each pads by at most BM-1; rounded up to BM."""
    bound = num_slots + min(num_experts, num_slots) * (block_size - 1)
    return triton.cdiv(bound, block_size) * block_size


def moe_align_block_size_torch(topk_ids: torch.Tensor, block_size: int, num_experts: int) -> AlignedRouting:
    """v1: the torch oracle (no host sync)."""
    device = topk_ids.device
    num_slots = topk_ids.numel()
    capacity = padded_capacity(num_slots, block_size, num_experts)
    flat = topk_ids.reshape(-1).long()                                   # [M*K]
    keys = torch.where(flat < 0, num_experts, flat)                      # skipped pairs sort last (key E)
    order = torch.argsort(keys, stable=True)                             # [M*K] slots grouped by expert
    sorted_keys = keys[order]
    kept = sorted_keys < num_experts                                     # [M*K] False for skipped pairs
    sorted_experts = sorted_keys.clamp_max(num_experts - 1)
    experts = torch.arange(num_experts, device=device)
    ends = torch.searchsorted(sorted_keys, experts, right=True)         # [E] inclusive prefix of counts
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    padded = (counts + block_size - 1) // block_size * block_size
    padded_ends = padded.cumsum(0)                                       # [E]
    rank = torch.arange(num_slots, device=device) - (ends - counts)[sorted_experts]
    dest = (padded_ends - padded)[sorted_experts] + rank                 # [M*K] position of each slot
    dest = torch.where(kept, dest, capacity)                             # skipped: one scratch slot past EM
    sorted_ids = torch.full((capacity + 1,), num_slots, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    sorted_ids = sorted_ids[:capacity]
    block_starts = torch.arange(capacity // block_size, device=device) * block_size
    total = padded_ends[-1]
    expert_ids = torch.searchsorted(padded_ends, block_starts, right=True)  # first expert ending past the block
    expert_ids = torch.where(block_starts < total, expert_ids, -1).to(torch.int32)
    return AlignedRouting(sorted_ids, expert_ids, total.reshape(1).to(torch.int32))


@triton.jit(do_not_specialize=["num_slots", "capacity", "chunk_len", "fill_len"])
def _align_count_kernel(
    topk_ids_ptr, partial_ptr, sorted_ptr,
    num_slots, capacity, chunk_len, fill_len,
    E_POW2: tl.constexpr, SUB: tl.constexpr, FILL: tl.constexpr,
):
    """Program p: histogram of its chunk of slots -> partial[p, :] (negative ids count nowhere);
    sentinel-fill its slice of sorted."""
    pid = tl.program_id(0)
    experts = tl.arange(0, E_POW2)
    counts = tl.zeros([E_POW2], dtype=tl.int32)
    for step in range(0, chunk_len, SUB):
        offs = pid * chunk_len + step + tl.arange(0, SUB)
        ids = tl.load(topk_ids_ptr + offs, mask=offs < num_slots, other=-1).to(tl.int32)
        counts += tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), axis=0)   # [SUB, E] -> [E]
    tl.store(partial_ptr + pid * E_POW2 + experts, counts)
    sentinel = tl.full([FILL], 0, dtype=tl.int32) + num_slots
    for step in range(0, fill_len, FILL):
        offs = pid * fill_len + step + tl.arange(0, FILL)
        tl.store(sorted_ptr + offs, sentinel, mask=offs < capacity)


@triton.jit
def _store_expert_ids(expert_ids_ptr, padded_ends, total, num_blocks,
                      BLOCK_SIZE_M: tl.constexpr, BLOCKS: tl.constexpr):
    """expert_ids[b] = the expert whose padded range holds block b's first row (-1 past `total`), from the
    experts' inclusive padded ends [E]."""
    for step in range(0, num_blocks, BLOCKS):
        blocks = step + tl.arange(0, BLOCKS)
        starts = blocks * BLOCK_SIZE_M
        expert = tl.sum((padded_ends[None, :] <= starts[:, None]).to(tl.int32), axis=1)  # [BLOCKS]
        expert = tl.where(starts < total, expert, -1)
        tl.store(expert_ids_ptr + blocks, expert, mask=blocks < num_blocks)


@triton.jit(do_not_specialize=["num_programs", "num_blocks"])
def _align_prefix_kernel(
    partial_ptr, base_ptr, expert_ids_ptr, num_post_ptr,
    num_programs, num_blocks,
    BLOCK_SIZE_M: tl.constexpr, E_POW2: tl.constexpr, P_POW2: tl.constexpr, BLOCKS: tl.constexpr,
):
    """One program: padded expert offsets, base[p, e] = first slot of expert e for chunk p, expert_ids."""
    rows = tl.arange(0, P_POW2)
    experts = tl.arange(0, E_POW2)
    tile_offs = rows[:, None] * E_POW2 + experts[None, :]
    row_mask = rows[:, None] < num_programs
    partial = tl.load(partial_ptr + tile_offs, mask=row_mask, other=0)          # [P, E]
    counts = tl.sum(partial, axis=0)                                             # [E]
    padded = (counts + BLOCK_SIZE_M - 1) // BLOCK_SIZE_M * BLOCK_SIZE_M
    padded_ends = tl.cumsum(padded, axis=0)                                      # [E]
    before = tl.cumsum(partial, axis=0) - partial                                # [P, E] earlier chunks
    tl.store(base_ptr + tile_offs, (padded_ends - padded)[None, :] + before, mask=row_mask)
    total = tl.sum(padded, axis=0)
    tl.store(num_post_ptr, total)
    _store_expert_ids(expert_ids_ptr, padded_ends, total, num_blocks, BLOCK_SIZE_M, BLOCKS)


@triton.jit(do_not_specialize=["num_slots", "chunk_len"])
def _align_scatter_kernel(
    topk_ids_ptr, base_ptr, sorted_ptr,
    num_slots, chunk_len,
    E_POW2: tl.constexpr, SUB: tl.constexpr,
):
    """Program p: write each slot of its chunk at base[p, e] + (its rank among earlier slots of e);
    skipped slots (negative ids) match no expert and are not written."""
    pid = tl.program_id(0)
    experts = tl.arange(0, E_POW2)
    running = tl.load(base_ptr + pid * E_POW2 + experts)                         # [E] next free position
    for step in range(0, chunk_len, SUB):
        offs = pid * chunk_len + step + tl.arange(0, SUB)
        valid = offs < num_slots
        ids = tl.load(topk_ids_ptr + offs, mask=valid, other=-1).to(tl.int32)
        onehot = (ids[:, None] == experts[None, :]).to(tl.int32)                # [SUB, E]
        rank = tl.cumsum(onehot, axis=0) - 1                                     # [SUB, E] stable rank
        pos = tl.sum(onehot * (running[None, :] + rank), axis=1)                # [SUB]
        tl.store(sorted_ptr + pos, offs, mask=valid & (ids >= 0))
        running += tl.sum(onehot, axis=0)


@triton.jit(do_not_specialize=["num_slots", "capacity", "num_blocks"])
def _align_one_program_kernel(
    topk_ids_ptr, sorted_ptr, expert_ids_ptr, num_post_ptr,
    num_slots, capacity, num_blocks,
    BLOCK_SIZE_M: tl.constexpr, E_POW2: tl.constexpr, S_POW2: tl.constexpr, FILL: tl.constexpr,
    BLOCKS: tl.constexpr,
):
    """All of v2 in one program for few slots: counts, padded offsets and expert_ids from one [S, E] one-hot
    tile, the sentinel fill, a barrier (the fill and the scatter may touch the same positions from
    different threads), then each slot's stable position."""
    offs = tl.arange(0, S_POW2)
    valid = offs < num_slots
    ids = tl.load(topk_ids_ptr + offs, mask=valid, other=-1).to(tl.int32)
    experts = tl.arange(0, E_POW2)
    onehot = (ids[:, None] == experts[None, :]).to(tl.int32)                     # [S, E]
    counts = tl.sum(onehot, axis=0)                                              # [E]
    padded = (counts + BLOCK_SIZE_M - 1) // BLOCK_SIZE_M * BLOCK_SIZE_M
    padded_ends = tl.cumsum(padded, axis=0)                                      # [E]
    total = tl.sum(padded, axis=0)
    tl.store(num_post_ptr, total)
    _store_expert_ids(expert_ids_ptr, padded_ends, total, num_blocks, BLOCK_SIZE_M, BLOCKS)
    sentinel = tl.full([FILL], 0, dtype=tl.int32) + num_slots
    for step in range(0, capacity, FILL):
        fill = step + tl.arange(0, FILL)
        tl.store(sorted_ptr + fill, sentinel, mask=fill < capacity)
    tl.debug_barrier()
    rank = tl.cumsum(onehot, axis=0) - 1                                         # [S, E] stable rank
    pos = tl.sum(onehot * ((padded_ends - padded)[None, :] + rank), axis=1)      # [S]
    tl.store(sorted_ptr + pos, offs, mask=valid & (ids >= 0))


def moe_align_block_size(topk_ids: torch.Tensor, block_size: int, num_experts: int,
                         one_program_max_elements: int = SMALL_TILE_ELEMENTS) -> AlignedRouting:
    """v2: one Triton launch up to `one_program_max_elements` slot x expert pairs (powers of two), else three;
    no host sync; same output as moe_align_block_size_torch."""
    device = topk_ids.device
    flat = topk_ids.reshape(-1)                                                  # [M*K]
    num_slots = flat.numel()
    capacity = padded_capacity(num_slots, block_size, num_experts)
    num_blocks = capacity // block_size
    sorted_ids = torch.empty(capacity, dtype=torch.int32, device=device)
    expert_ids = torch.empty(num_blocks, dtype=torch.int32, device=device)
    num_post = torch.zeros(1, dtype=torch.int32, device=device)
    if num_slots == 0:
        return AlignedRouting(sorted_ids, expert_ids, num_post)
    e_pow2 = triton.next_power_of_2(num_experts)
    s_pow2 = triton.next_power_of_2(num_slots)
    if s_pow2 * e_pow2 <= one_program_max_elements:
        _align_one_program_kernel[(1,)](
            flat, sorted_ids, expert_ids, num_post, num_slots, capacity, num_blocks,
            BLOCK_SIZE_M=block_size, E_POW2=e_pow2, S_POW2=s_pow2, FILL=FILL_BLOCK, BLOCKS=BLOCKS_PER_STEP,
            num_warps=4 if s_pow2 * e_pow2 <= 4096 else 8)
        return AlignedRouting(sorted_ids, expert_ids, num_post)
    chunk_len = triton.cdiv(triton.cdiv(num_slots, MAX_PROGRAMS), SUB_ROWS) * SUB_ROWS
    num_programs = triton.cdiv(num_slots, chunk_len)
    fill_len = triton.cdiv(triton.cdiv(capacity, num_programs), FILL_BLOCK) * FILL_BLOCK
    partial = torch.empty(num_programs, e_pow2, dtype=torch.int32, device=device)  # [P, E] counts
    base = torch.empty_like(partial)                                                # [P, E] first slots
    _align_count_kernel[(num_programs,)](
        flat, partial, sorted_ids, num_slots, capacity, chunk_len, fill_len,
        E_POW2=e_pow2, SUB=SUB_ROWS, FILL=FILL_BLOCK, num_warps=4)
    _align_prefix_kernel[(1,)](
        partial, base, expert_ids, num_post, num_programs, num_blocks,
        BLOCK_SIZE_M=block_size, E_POW2=e_pow2, P_POW2=triton.next_power_of_2(num_programs),
        BLOCKS=BLOCKS_PER_STEP, num_warps=8)
    _align_scatter_kernel[(num_programs,)](
        flat, base, sorted_ids, num_slots, chunk_len, E_POW2=e_pow2, SUB=SUB_ROWS, num_warps=4)
    return AlignedRouting(sorted_ids, expert_ids, num_post)
