"""Expert parallelism in the fused MoE: pairs of experts another rank holds (topk id -1, as
runtime.distributed.layers.local_expert_routing marks them) get no row in the align step, no GEMM
work, and add nothing to the top-k sum; the torch reference accepts the same id.

Without CUDA the kernels run in Triton's CPU interpreter in float32 (see test_fused_moe.py).
Legend: M = tokens, E = experts (El = one rank's), K = top-k, H = hidden, I = intermediate, BM = block size.
"""
from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from kernels.fused_moe.align import SKIP_EXPERT, moe_align_block_size, moe_align_block_size_torch  # noqa: E402
from kernels.fused_moe.combine import topk_sum  # noqa: E402
from kernels.fused_moe.fused_moe_triton import fused_moe  # noqa: E402
from kernels.fused_moe.ref import fused_moe_ref  # noqa: E402
from kernels.fused_moe.synthetic import (  # noqa: E402
    random_expert_weights, random_topk_ids, random_topk_weights)
from runtime.distributed.layers import local_expert_routing  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"
E, H, I, K = 8, 64, 32, 2


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def skip_pairs(ids: torch.Tensor, which: str, seed: int = 0) -> torch.Tensor:
    """ids with some pairs marked SKIP_EXPERT: none, all, or a random half."""
    if which == "none":
        return ids.clone()
    if which == "all":
        return torch.full_like(ids, SKIP_EXPERT)
    drop = torch.rand(ids.shape, generator=torch.Generator().manual_seed(seed)) < 0.5
    return ids.masked_fill(drop.to(ids.device), SKIP_EXPERT)


def dropped_reference(x, w13, w2, weights, ids):
    """The reference with the skipped pairs dropped the old way: weight 0 on a real expert."""
    kept = ids >= 0
    return fused_moe_ref(x, w13, w2, weights * kept, torch.where(kept, ids, torch.zeros_like(ids)))


def make_inputs(num_tokens, num_experts=E, top_k=K, seed=0):
    gen = torch.Generator().manual_seed(seed)
    wgen = torch.Generator(device=DEVICE).manual_seed(seed)
    w13 = random_expert_weights(num_experts, 2 * I, H, torch.float32, generator=wgen, device=DEVICE)
    w2 = random_expert_weights(num_experts, H, I, torch.float32, generator=wgen, device=DEVICE)
    x = torch.randn(num_tokens, H, generator=gen).to(DEVICE)
    ids = random_topk_ids(num_tokens, num_experts, top_k, generator=gen).to(DEVICE)
    weights = random_topk_weights(num_tokens, top_k, generator=gen).to(DEVICE)
    return x, w13, w2, weights, ids


# ---- align -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("num_tokens", [1, 3, 40, 300])
@pytest.mark.parametrize("which", ["none", "half", "all"])
@pytest.mark.parametrize("block_size", [4, 16])
def test_align_leaves_skipped_pairs_out(num_tokens, which, block_size):
    ids = skip_pairs(random_topk_ids(num_tokens, E, K, generator=torch.Generator().manual_seed(num_tokens)),
                     which, seed=num_tokens).to(DEVICE)
    got = moe_align_block_size(ids, block_size, E)
    want = moe_align_block_size_torch(ids, block_size, E)
    for a, b in zip(got, want):
        assert torch.equal(a.cpu(), b.cpu()), "Triton and torch versions agree bit for bit"
    flat = ids.reshape(-1).long().cpu()
    num_slots = flat.numel()
    sorted_ids, expert_ids = got.sorted_token_ids.cpu(), got.expert_ids.cpu()
    used = int(got.num_tokens_post_padded.item())
    kept = flat >= 0
    counts = torch.bincount(flat[kept], minlength=E)
    assert used == int(((counts + block_size - 1) // block_size * block_size).sum()), "only real pairs padded"
    assert sorted_ids.numel() == moe_align_block_size(torch.zeros_like(ids), block_size, E).sorted_token_ids.numel(), \
        "the buffer keeps its worst-case size"
    listed = sorted_ids[sorted_ids < num_slots].long()
    assert torch.equal(listed.sort().values, kept.nonzero().flatten()), "every kept pair once, no skipped one"
    assert torch.all(sorted_ids[used:] == num_slots)
    assert torch.all(expert_ids[used // block_size:] == -1)
    for block in range(used // block_size):
        slots = sorted_ids[block * block_size:(block + 1) * block_size]
        slots = slots[slots < num_slots].long()
        assert slots.numel() > 0 and torch.all(flat[slots] == expert_ids[block])
    if which == "all":
        assert used == 0


def test_ep_halves_the_gemm_blocks_of_a_deepseek_v2_lite_shape():
    """E = 64, K = 6 split over ep = 2 (El = 32): with the -1 ids a rank's GEMMs run about half the
    row blocks of computing all pairs (the others at weight 0 on local expert 0, as before)."""
    num_experts, top_k, block_size, ep = 64, 6, 16, 2
    ids = random_topk_ids(512, num_experts, top_k, generator=torch.Generator().manual_seed(0))
    local = num_experts // ep
    blocks = {}
    for rank in range(ep):
        _, own = local_expert_routing(torch.ones(ids.shape), ids, rank * local, local)
        old = own.clamp_min(0)                               # foreign pairs on local expert 0
        blocks[rank] = [int(moe_align_block_size_torch(r, block_size, local).num_tokens_post_padded) // block_size
                        for r in (old, own)]
        own_counts = torch.bincount(own[own >= 0].long(), minlength=local)
        assert blocks[rank][1] == int(((own_counts + block_size - 1) // block_size).sum())
    before, after = sum(b[0] for b in blocks.values()), sum(b[1] for b in blocks.values())
    assert after < 0.6 * before, blocks


# ---- fused MoE ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("num_tokens", [1, 5, 40])
@pytest.mark.parametrize("which", ["none", "half", "all"])
def test_fused_moe_skips_pairs_like_the_reference_drops_them(num_tokens, which):
    x, w13, w2, weights, ids = make_inputs(num_tokens, seed=num_tokens)
    ids = skip_pairs(ids, which, seed=num_tokens + 1)
    want = dropped_reference(x, w13, w2, weights, ids)
    ref = fused_moe_ref(x, w13, w2, weights, ids)
    assert rel_err(ref, want) <= 1e-6, "the reference accepts -1 and drops those pairs"
    out = fused_moe(x, w13, w2, weights, ids)
    if which == "all":
        assert torch.equal(out, torch.zeros_like(out))
    else:
        assert rel_err(out, want) <= 1e-4


def test_fused_moe_skipped_pairs_ignore_their_weights_and_inplace():
    """A skipped pair's weight is never read (NaN there changes nothing); inplace overwrites every row,
    also one whose pairs are all skipped."""
    x, w13, w2, weights, ids = make_inputs(9, seed=3)
    ids = skip_pairs(ids, "half", seed=4)
    ids[2] = SKIP_EXPERT                                      # token 2: nothing on this rank
    want = dropped_reference(x, w13, w2, weights, ids)
    weights = weights.masked_fill(ids < 0, float("nan"))
    out = fused_moe(x.clone(), w13, w2, weights, ids, inplace=False)
    assert rel_err(out, want) <= 1e-4 and torch.equal(out[2], torch.zeros_like(out[2]))
    y = x.clone()
    fused_moe(y, w13, w2, weights, ids, inplace=True)
    assert torch.equal(y, out)


def test_topk_sum_reads_only_kept_rows():
    rows = torch.randn(12, 40, device=DEVICE)
    ids = torch.tensor([[0, 1, 2], [-1, 3, -1], [-1, -1, -1], [5, -1, 7]], device=DEVICE)
    rows.view(4, 3, 40)[ids < 0] = float("nan")               # never-written rows: must not be read
    out = topk_sum(rows, ids, torch.empty(4, 40, device=DEVICE))
    want = torch.where((ids >= 0)[:, :, None], rows.view(4, 3, 40), 0.0).sum(dim=1)
    assert torch.allclose(out, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("ep", [2, 4])
def test_ranks_own_pairs_sum_to_the_whole_layer(ep):
    """local_expert_routing + fused_moe on each rank's experts, summed over ranks (the layer's
    all-reduce), equals the whole layer on one process; each rank computes only its pairs."""
    x, w13, w2, weights, ids = make_inputs(17, seed=ep)
    whole = fused_moe_ref(x, w13, w2, weights, ids)
    local = E // ep
    total = torch.zeros_like(whole)
    pairs = 0
    for rank in range(ep):
        first = rank * local
        rank_weights, rank_ids = local_expert_routing(weights, ids, first, local)
        assert torch.equal(rank_weights, weights)
        mine = (ids >= first) & (ids < first + local)
        assert torch.equal(rank_ids >= 0, mine) and torch.equal(rank_ids[mine], ids[mine] - first)
        pairs += int(mine.sum())
        total += fused_moe(x, w13[first:first + local], w2[first:first + local], rank_weights, rank_ids)
    assert pairs == ids.numel(), "every pair computed on exactly one rank"
    assert rel_err(total, whole) <= 1e-4
