"""Fused MoE Triton kernels (kernels/fused_moe/) against the torch reference (ref.py).

Without CUDA the kernels run in Triton's CPU interpreter: TRITON_INTERPRET=1 is set below, before
the kernel modules are imported, because triton.jit reads it when a kernel is defined. The
interpreter computes bfloat16 dots wrongly and rounds fp8 wrongly, so CPU tests use float32/float16;
bf16 and fp8 tests carry the `gpu` marker. With CUDA the same grid runs on the GPU.
Legend: M = tokens, E = experts, K = top-k, H = hidden, I = intermediate, BM = block size.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from kernels.fused_moe import config as moe_config  # noqa: E402
from kernels.fused_moe.align import moe_align_block_size, moe_align_block_size_torch  # noqa: E402
from kernels.fused_moe.fused_moe_triton import fused_moe  # noqa: E402
from kernels.fused_moe.ref import fused_moe_ref  # noqa: E402
from kernels.fused_moe.synthetic import (  # noqa: E402
    balanced_topk_ids, random_expert_weights, random_topk_ids, random_topk_weights)
from kernels.fused_moe.tune import block_m_candidates, tile_candidates  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"
E, H, I = 8, 64, 32
M_VALUES = (0, 1, 3, 17, 64)
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def make_inputs(num_tokens, num_experts, hidden, inter, top_k, dtype, routing="random", seed=0):
    gen = torch.Generator().manual_seed(seed)
    wgen = torch.Generator(device=DEVICE).manual_seed(seed)
    w13 = random_expert_weights(num_experts, 2 * inter, hidden, dtype, generator=wgen, device=DEVICE)
    w2 = random_expert_weights(num_experts, hidden, inter, dtype, generator=wgen, device=DEVICE)
    x = torch.randn(num_tokens, hidden, generator=gen).to(DEVICE, dtype)
    if routing == "random":          # experts 0..E/2-1 only: the others receive no token
        ids = random_topk_ids(num_tokens, num_experts, top_k, generator=gen, num_active_experts=num_experts // 2)
    elif routing == "one_expert":    # every token to expert 3 (top-1) or 3..3+K-1
        ids = (torch.arange(top_k) + 3).repeat(num_tokens, 1).to(torch.int32)
    else:
        ids = balanced_topk_ids(num_tokens, num_experts, top_k, generator=gen)
    weights = random_topk_weights(num_tokens, top_k, generator=gen)
    return x, w13, w2, weights.to(DEVICE), ids.to(DEVICE)


# ---- alignment -------------------------------------------------------------------------------------

def check_alignment(routing, topk_ids: torch.Tensor, block_size: int, num_experts: int) -> None:
    sorted_ids, expert_ids = routing.sorted_token_ids.cpu(), routing.expert_ids.cpu()
    used = int(routing.num_tokens_post_padded.item())
    flat = topk_ids.reshape(-1).long().cpu()
    num_slots = flat.numel()
    assert used % block_size == 0 and used <= sorted_ids.numel()
    assert sorted_ids.numel() == expert_ids.numel() * block_size
    assert torch.all(sorted_ids[used:] == num_slots), "unused tail must be sentinel"
    real = sorted_ids[:used][sorted_ids[:used] < num_slots].long()
    assert torch.equal(real.sort().values, torch.arange(num_slots)), "every (t, k) exactly once"
    assert torch.all(sorted_ids[:used] <= num_slots), "padding is exactly the sentinel M*K"
    assert torch.all(expert_ids[used // block_size:] == -1)
    counts = torch.bincount(flat, minlength=num_experts)
    blocks_per_expert = torch.bincount(expert_ids[:used // block_size].long(), minlength=num_experts)
    assert torch.equal(blocks_per_expert, (counts + block_size - 1) // block_size), "no block for empty experts"
    for block in range(used // block_size):
        slots = sorted_ids[block * block_size:(block + 1) * block_size]
        slots = slots[slots < num_slots].long()
        assert slots.numel() > 0 and torch.all(flat[slots] == expert_ids[block]), "a block holds one expert"
    assert torch.all(expert_ids[:used // block_size].diff() >= 0), "experts in ascending order"


@pytest.mark.parametrize("num_tokens", M_VALUES + (700,))
@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("block_size", [4, 16])
def test_align_properties_and_versions_agree(num_tokens, top_k, block_size):
    ids = random_topk_ids(num_tokens, E, top_k, generator=torch.Generator().manual_seed(num_tokens),
                          num_active_experts=5).to(DEVICE)
    triton_routing = moe_align_block_size(ids, block_size, E)
    torch_routing = moe_align_block_size_torch(ids, block_size, E)
    check_alignment(torch_routing, ids, block_size, E)
    for got, want in zip(triton_routing, torch_routing):
        assert torch.equal(got.cpu(), want.cpu())


def test_align_all_tokens_to_one_expert():
    ids = torch.full((33, 1), 7, dtype=torch.int64, device=DEVICE)
    routing = moe_align_block_size(ids, 16, E)
    check_alignment(routing, ids, 16, E)
    assert routing.num_tokens_post_padded.item() == 48
    assert routing.expert_ids[:3].tolist() == [7, 7, 7]


# ---- fused MoE vs reference --------------------------------------------------------------------------

TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("num_tokens", M_VALUES)
@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_moe_matches_ref(num_tokens, top_k, dtype):
    x, w13, w2, weights, ids = make_inputs(num_tokens, E, H, I, top_k, dtype, seed=num_tokens)
    out = fused_moe(x, w13, w2, weights, ids)
    assert out.shape == x.shape and out.dtype == dtype
    if num_tokens:
        assert rel_err(out, fused_moe_ref(x, w13, w2, weights, ids)) <= TOLERANCE[dtype]


@pytest.mark.parametrize("routing", ["one_expert", "balanced"])
@pytest.mark.parametrize("fuse_silu", [True, False])
def test_fused_moe_routings_and_unfused_path(routing, fuse_silu):
    x, w13, w2, weights, ids = make_inputs(17, E, H, I, 2, torch.float16, routing=routing)
    out = fused_moe(x, w13, w2, weights, ids, fuse_silu=fuse_silu)
    assert rel_err(out, fused_moe_ref(x, w13, w2, weights, ids)) <= TOLERANCE[torch.float16]


@pytest.mark.parametrize("config", [
    # several N tiles and K steps, GROUP_SIZE_M swizzle, D not a multiple of BK (H = 48, I = 24)
    {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 2,
     "num_warps": 4, "num_stages": 2},
    {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 1,
     "num_warps": 4, "num_stages": 2, "down": {"BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 4}},
    moe_config.default_config(4096, E, 2, "fp16"),   # the large-M default: BM 128, its own down tile
])
def test_fused_moe_explicit_configs_and_ragged_dims(config):
    x, w13, w2, weights, ids = make_inputs(40, E, 48, 24, 2, torch.float32)
    out = fused_moe(x, w13, w2, weights, ids, config=config)
    assert rel_err(out, fused_moe_ref(x, w13, w2, weights, ids)) <= TOLERANCE[torch.float32]


def test_fused_moe_inplace():
    x, w13, w2, weights, ids = make_inputs(9, E, H, I, 2, torch.float32)
    ref = fused_moe_ref(x, w13, w2, weights, ids)
    out = fused_moe(x, w13, w2, weights, ids, inplace=True)
    assert out.data_ptr() == x.data_ptr()
    assert rel_err(x, ref) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("num_tokens,hidden,inter", [(1, 256, 128), (17, 384, 192)])
def test_fp8_block_scaled_gemm_with_torch_quantiser(num_tokens, hidden, inter, monkeypatch):
    """The fp8 GEMM path (block scales; with I = 192 one 128-row block holds gate and up rows) with the
    activation quantiser swapped for its torch reference: the interpreter rounds float->fp8 casts
    wrongly. The Triton quantiser itself is checked on the GPU."""
    import kernels.fused_moe.fused_moe_triton as fused_moe_module
    from kernels.fused_moe.quant import quantize_weight_block_fp8
    from kernels.fused_moe.ref import fused_moe_fp8_ref, per_token_group_quant_fp8_ref
    monkeypatch.setattr(fused_moe_module, "per_token_group_quant_fp8", per_token_group_quant_fp8_ref)
    x, w13, w2, weights, ids = make_inputs(num_tokens, E, hidden, inter, 2, torch.float16)
    (w13_q, w13_s), (w2_q, w2_s) = quantize_weight_block_fp8(w13), quantize_weight_block_fp8(w2)
    out = fused_moe_module.fused_moe(x, w13_q, w2_q, weights, ids, w13_scale=w13_s, w2_scale=w2_s)
    assert rel_err(out, fused_moe_fp8_ref(x, w13_q, w2_q, w13_s, w2_s, weights, ids)) <= 5e-3


# ---- configs -----------------------------------------------------------------------------------------

def test_config_table_nearest_m(tmp_path):
    small = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
             "num_stages": 4}
    large = dict(small, BLOCK_SIZE_M=64, down={"BLOCK_SIZE_N": 128})
    name = moe_config.config_file_name(E, I, "TestGPU", "fp16")
    (tmp_path / name).write_text(json.dumps({"1": small, "256": large}))
    get = lambda m: moe_config.get_config(m, E, 2, I, "fp16", device="TestGPU", config_dir=tmp_path)  # noqa: E731
    assert get(100)["BLOCK_SIZE_M"] == 16 and get(200)["BLOCK_SIZE_M"] == 64
    gate_up, down = moe_config.split_config(get(4096))
    assert gate_up["BLOCK_SIZE_N"] == 32 and down["BLOCK_SIZE_N"] == 128 and down["BLOCK_SIZE_M"] == 64
    assert moe_config.get_config(1, E, 2, I, "fp16", device="Other", config_dir=tmp_path)["BLOCK_SIZE_M"] == 16


def test_default_and_tuner_configs_fit_shared_memory():
    for m in (1, 64, 512, 4096):
        cfg = moe_config.default_config(m, 256, 8)
        for elt, fp8 in ((2, False), (4, False), (1, True)):
            fitted = moe_config.fit_config(cfg, elt, elt, gated=True, use_fp8=fp8)
            assert moe_config.shared_memory_bytes(fitted, elt, elt, True) <= moe_config.SHARED_MEMORY_BYTES
            assert not fp8 or 128 % fitted["BLOCK_SIZE_K"] == 0
    for m in (1, 512, 1024, 4096):
        for bm in block_m_candidates(m, 256, 8):
            for gated in (True, False):
                assert 6 <= len(tile_candidates(bm, gated, False, 2)) <= 12


# ---- GPU only: bf16, DeepSeek-V3-like shapes, fp8 block-scaled -----------------------------------------

@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens,num_experts,hidden,inter,top_k,routing", [
    (1, 8, 256, 128, 2, "random"),
    (64, 16, 1024, 512, 4, "balanced"),
    (300, 64, 2048, 768, 6, "random"),
    (3, 16, 7168, 2048, 8, "balanced"),      # DeepSeek-V3 tp=1 expert shape, fewer experts
    (1, 256, 7168, 256, 8, "balanced"),      # DeepSeek-V3 tp=8 shard
    (64, 256, 7168, 256, 8, "balanced"),
    (777, 256, 7168, 256, 8, "random"),
])
def test_bf16_matches_ref_gpu(num_tokens, num_experts, hidden, inter, top_k, routing):
    x, w13, w2, weights, ids = make_inputs(num_tokens, num_experts, hidden, inter, top_k, torch.bfloat16,
                                           routing=routing)
    ref = fused_moe_ref(x, w13, w2, weights, ids)
    assert rel_err(fused_moe(x, w13, w2, weights, ids), ref) <= TOLERANCE[torch.bfloat16]
    assert rel_err(fused_moe(x, w13, w2, weights, ids, fuse_silu=False), ref) <= TOLERANCE[torch.bfloat16]


@gpu
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("block_m", [16, 32, 64, 128])
def test_every_tuner_tile_is_correct_gpu(block_m):
    """Every tile tune.py may pick computes the right thing (K = 8 and dims divisible by 256 like
    DeepSeek-V3, so these compiles are the ones the tuner reuses from Triton's cache)."""
    x, w13, w2, weights, ids = make_inputs(200, 32, 1024, 256, 8, torch.bfloat16, routing="balanced")
    ref = fused_moe_ref(x, w13, w2, weights, ids)
    ups, downs = tile_candidates(block_m, True, False, 2), tile_candidates(block_m, False, False, 2)
    for i in range(max(len(ups), len(downs))):
        cfg = dict(ups[i % len(ups)], down={k: downs[i % len(downs)][k] for k in moe_config.TILE_KEYS})
        assert rel_err(fused_moe(x, w13, w2, weights, ids, config=cfg), ref) <= TOLERANCE[torch.bfloat16], cfg


@gpu
@pytest.mark.gpu
def test_per_token_group_quant_gpu():
    from kernels.fused_moe.quant import per_token_group_quant_fp8
    from kernels.fused_moe.ref import per_token_group_quant_fp8_ref
    x = torch.randn(37, 7168 + 64, device=DEVICE, dtype=torch.bfloat16) * 3
    q, scale = per_token_group_quant_fp8(x)
    q_ref, scale_ref = per_token_group_quant_fp8_ref(x)
    torch.testing.assert_close(scale, scale_ref, rtol=1e-5, atol=0)   # Triton's fp32 division may be 2 ulp off
    assert (q.float() != q_ref.float()).float().mean() < 1e-3, "fp8 values may differ only at rounding ties"
    assert rel_err(q.float() * scale.repeat_interleave(128, 1)[:, :x.shape[1]], x) < 5e-2


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens,num_experts,hidden,inter,top_k", [
    (5, 16, 512, 256, 4),
    (17, 8, 384, 192, 2),       # I = 192: one 128-row weight block holds gate and up rows
    (64, 256, 7168, 256, 8),    # DeepSeek-V3 tp=8 shard
    (300, 32, 7168, 2048, 8),   # DeepSeek-V3 tp=1 expert shape, fewer experts
])
def test_fp8_block_scaled_matches_ref_gpu(num_tokens, num_experts, hidden, inter, top_k):
    from kernels.fused_moe.quant import quantize_weight_block_fp8
    from kernels.fused_moe.ref import fused_moe_fp8_ref
    x, w13, w2, weights, ids = make_inputs(num_tokens, num_experts, hidden, inter, top_k, torch.bfloat16,
                                           routing="balanced" if num_experts % top_k == 0 else "random")
    w13_q, w13_s = quantize_weight_block_fp8(w13)
    w2_q, w2_s = quantize_weight_block_fp8(w2)
    out = fused_moe(x, w13_q, w2_q, weights, ids, w13_scale=w13_s, w2_scale=w2_s)
    emulated = fused_moe_fp8_ref(x, w13_q, w2_q, w13_s, w2_s, weights, ids)
    plain = fused_moe_fp8_ref(x, w13_q, w2_q, w13_s, w2_s, weights, ids, quantize_activations=False)
    assert rel_err(out, emulated) <= 3e-2
    assert rel_err(out, plain) <= 1e-1
    assert rel_err(out, fused_moe_ref(x, w13, w2, weights, ids)) <= 1.5e-1
