"""MLA attention kernels (Triton, FlashInfer) against the torch references in kernels/mla_attention/ref.py.

Without CUDA the Triton kernels run in Triton's CPU interpreter: TRITON_INTERPRET=1 is set below before
any kernel module is imported, because triton.jit reads it when a kernel is decorated. (If another module
imported the kernels first, this has no effect; a root conftest.py setting it is the robust fix.)
The interpreter computes bfloat16 dots wrongly, so CPU tests use float32/float16 and tiny shapes; the
`gpu` tests use bfloat16 at DeepSeek's C=512, R=64 and allow 1e-2 relative error.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernels.mla_attention.flashinfer_mla import FlashInferMLA, flashinfer_available  # noqa: E402
from kernels.mla_attention.ref import mla_decode_ref, mla_extend_ref  # noqa: E402
from kernels.mla_attention.triton_decode import (  # noqa: E402
    mla_attention_rows_triton, mla_decode_triton, mla_extend_triton,
)

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
needs_flashinfer = pytest.mark.skipif(not (HAS_CUDA and flashinfer_available()), reason="needs flashinfer + GPU")


def make_cache(kv_lens, num_heads, latent_dim, rope_dim, dtype, device, num_q=None, seed=0, num_slots=None):
    """Random pool with each sequence's tokens at random, shuffled, non-contiguous slots."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(kv_lens)
    num_slots = num_slots or total + 64
    kv_cache = (torch.randn(num_slots, latent_dim + rope_dim, generator=gen) * 0.5).to(dtype).to(device)
    kv_indices = torch.randperm(num_slots, generator=gen)[:total].to(torch.int32).to(device)
    kv_indptr = torch.tensor([0] + torch.tensor(kv_lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    rows = len(kv_lens) if num_q is None else num_q
    q_nope = torch.randn(rows, num_heads, latent_dim, generator=gen).to(dtype).to(device)
    q_rope = torch.randn(rows, num_heads, rope_dim, generator=gen).to(dtype).to(device)
    return q_nope, q_rope, kv_cache, kv_indptr, kv_indices


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.float()
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-12)).item()


# ---------------------------------------------------------------- CPU (interpreter) or GPU, fp32/fp16
@pytest.mark.parametrize("dtype,num_kv_splits", [(torch.float32, 1), (torch.float32, 4), (torch.float16, 3)])
@pytest.mark.parametrize("num_heads", [1, 16])
@pytest.mark.parametrize("kv_len", [1, 7, 130])
@pytest.mark.parametrize("batch", [1, 3])
def test_triton_decode_matches_ref(batch, kv_len, num_heads, dtype, num_kv_splits):
    device = "cuda" if HAS_CUDA else "cpu"
    kv_lens = [max(1, kv_len - 5 * b) for b in range(batch)]            # ragged
    q_nope, q_rope, kv_cache, kv_indptr, kv_indices = make_cache(kv_lens, num_heads, 32, 16, dtype, device)
    sm_scale = 1 / 48 ** 0.5
    out = mla_decode_triton(q_nope, q_rope, kv_cache, kv_indptr, kv_indices, sm_scale, num_kv_splits)
    ref = mla_decode_ref(q_nope.float(), q_rope.float(), kv_cache.float(), kv_indptr, kv_indices, sm_scale)
    assert out.shape == (batch, num_heads, 32) and out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 and not HAS_CUDA else 5e-3
    assert rel_err(out, ref) < tol


def test_triton_decode_default_splits_and_separate_buffers():
    device = "cuda" if HAS_CUDA else "cpu"
    q_nope, q_rope, kv_cache, kv_indptr, kv_indices = make_cache([40, 3], 16, 32, 16, torch.float32, device)
    ref = mla_decode_ref(q_nope, q_rope, kv_cache, kv_indptr, kv_indices, 0.2)
    combined = mla_decode_triton(q_nope, q_rope, kv_cache, kv_indptr, kv_indices, 0.2)   # heuristic splits
    ckv, kpe = kv_cache[:, :32].contiguous(), kv_cache[:, 32:].contiguous()           # two-buffer pool
    separate = mla_attention_rows_triton(q_nope, q_rope, ckv, kpe, kv_indptr[:-1], kv_indptr[1:], kv_indices,
                                         0.2, num_kv_splits=2)
    assert rel_err(combined, ref) < 1e-3 and rel_err(separate, ref) < 1e-3


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("num_kv_splits", [1, 2])
def test_triton_extend_matches_ref(causal, num_kv_splits):
    device = "cuda" if HAS_CUDA else "cpu"
    q_lens, kv_lens = [3, 0, 1, 5], [9, 4, 1, 5]                        # prefix 6, idle, decode-like, no prefix
    q_nope, q_rope, kv_cache, kv_indptr, kv_indices = make_cache(
        kv_lens, 4, 32, 16, torch.float32, device, num_q=sum(q_lens))
    qo_indptr = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    out = mla_extend_triton(q_nope, q_rope, kv_cache, qo_indptr, kv_indptr, kv_indices, 0.25, causal,
                            num_kv_splits)
    ref = mla_extend_ref(q_nope, q_rope, kv_cache, qo_indptr, kv_indptr, kv_indices, 0.25, causal)
    assert rel_err(out, ref) < 1e-3


def test_extend_ref_with_one_token_is_decode_ref():
    q_nope, q_rope, kv_cache, kv_indptr, kv_indices = make_cache([5, 9], 4, 32, 16, torch.float32, "cpu")
    decode = mla_decode_ref(q_nope, q_rope, kv_cache, kv_indptr, kv_indices, 0.3)
    extend = mla_extend_ref(q_nope, q_rope, kv_cache, torch.arange(3), kv_indptr, kv_indices, 0.3)
    torch.testing.assert_close(decode, extend)


# ---------------------------------------------------------------- GPU, bf16
@gpu
@needs_cuda
@pytest.mark.parametrize("latent_dim,rope_dim", [(512, 64), (32, 16)])
@pytest.mark.parametrize("num_heads", [16, 128])
@pytest.mark.parametrize("kv_lens", [[1], [1000, 37, 513, 1, 64]])
def test_triton_decode_bf16_gpu(latent_dim, rope_dim, num_heads, kv_lens):
    q_nope, q_rope, kv_cache, kv_indptr, kv_indices = make_cache(
        kv_lens, num_heads, latent_dim, rope_dim, torch.bfloat16, "cuda")
    sm_scale = 1 / 192 ** 0.5
    ref = mla_decode_ref(q_nope.float(), q_rope.float(), kv_cache.float(), kv_indptr, kv_indices, sm_scale)
    for splits in (None, 1, 7):
        out = mla_decode_triton(q_nope, q_rope, kv_cache, kv_indptr, kv_indices, sm_scale, splits)
        assert rel_err(out, ref) < 1e-2, splits


@gpu
@needs_cuda
def test_triton_extend_bf16_gpu():
    q_lens, kv_lens = [5, 1, 33], [300, 1, 33]
    q_nope, q_rope, kv_cache, kv_indptr, kv_indices = make_cache(
        kv_lens, 16, 512, 64, torch.bfloat16, "cuda", num_q=sum(q_lens))
    qo_indptr = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    out = mla_extend_triton(q_nope, q_rope, kv_cache, qo_indptr, kv_indptr, kv_indices, 0.07)
    ref = mla_extend_ref(q_nope.float(), q_rope.float(), kv_cache.float(), qo_indptr, kv_indptr, kv_indices, 0.07)
    assert rel_err(out, ref) < 1e-2


def _cpu_indptr(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


@gpu
@needs_flashinfer
@pytest.mark.parametrize("num_heads", [16, 128])
def test_flashinfer_decode_bf16(num_heads):
    kv_lens = [1000, 37, 513, 1, 64, 4096]
    q_nope, q_rope, kv_cache, kv_indptr, kv_indices = make_cache(kv_lens, num_heads, 512, 64, torch.bfloat16, "cuda")
    sm_scale = 1 / 192 ** 0.5
    ref = mla_decode_ref(q_nope.float(), q_rope.float(), kv_cache.float(), kv_indptr, kv_indices, sm_scale)
    mla = FlashInferMLA("cuda")
    mla.plan(_cpu_indptr([1] * len(kv_lens)), _cpu_indptr(kv_lens), kv_indices,
             torch.tensor(kv_lens, dtype=torch.int32), num_heads, 512, 64, sm_scale,
             torch.bfloat16, torch.bfloat16, causal=False)
    out = mla.run(q_nope, q_rope, kv_cache)                                          # combined pool, views
    assert out.shape == q_nope.shape and rel_err(out, ref) < 1e-2
    separate = mla.run_split(q_nope, q_rope, kv_cache[:, :512].contiguous(), kv_cache[:, 512:].contiguous())
    assert rel_err(separate, ref) < 1e-2
    # q given as views of one [B, N, C + R] tensor, as a model produces it
    q_full = torch.cat([q_nope, q_rope], dim=-1)
    assert rel_err(mla.run(q_full[..., :512], q_full[..., 512:], kv_cache), ref) < 1e-2


@gpu
@needs_flashinfer
@pytest.mark.parametrize("num_heads", [16, 128])
def test_flashinfer_extend_with_prefix_bf16(num_heads):
    q_lens, kv_lens = [5, 1, 33, 200], [300, 17, 33, 1200]       # cached prefixes 295, 16, 0, 1000
    q_nope, q_rope, kv_cache, kv_indptr, kv_indices = make_cache(
        kv_lens, num_heads, 512, 64, torch.bfloat16, "cuda", num_q=sum(q_lens))
    qo_indptr = _cpu_indptr(q_lens)
    sm_scale = 1 / 192 ** 0.5
    ref = mla_extend_ref(q_nope.float(), q_rope.float(), kv_cache.float(), qo_indptr, kv_indptr, kv_indices,
                         sm_scale, causal=True)
    mla = FlashInferMLA("cuda")
    mla.plan(qo_indptr, _cpu_indptr(kv_lens), kv_indices, None, num_heads, 512, 64, sm_scale,
             torch.bfloat16, torch.bfloat16, causal=True)
    assert rel_err(mla.run(q_nope, q_rope, kv_cache), ref) < 1e-2


@gpu
@needs_flashinfer
def test_flashinfer_decode_cuda_graph_replay():
    """Capture run() once, re-plan with other lengths and slots (same batch size), replay."""
    num_heads, batch, sm_scale = 16, 4, 1 / 192 ** 0.5
    mla = FlashInferMLA("cuda", use_cuda_graph=True, max_batch_size=8, max_kv_tokens=8 * 2048)
    first = make_cache([100, 5, 700, 33], num_heads, 512, 64, torch.bfloat16, "cuda", seed=1, num_slots=8192)
    q_nope, q_rope, kv_cache = first[0].clone(), first[1].clone(), first[2]
    qo_indptr = _cpu_indptr([1] * batch)

    def plan(case):
        lens = (case[3][1:] - case[3][:-1]).cpu()
        mla.plan(qo_indptr, case[3].cpu(), case[4], lens, num_heads, 512, 64, sm_scale,
                 torch.bfloat16, torch.bfloat16)

    plan(first)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):      # warm-up (JIT, allocations) outside capture
        mla.run(q_nope, q_rope, kv_cache)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mla.run(q_nope, q_rope, kv_cache)
    for seed, lens in [(2, [1500, 1, 64, 900]), (3, [7, 2048, 300, 1])]:
        case = make_cache(lens, num_heads, 512, 64, torch.bfloat16, "cuda", seed=seed, num_slots=8192)
        kv_cache.copy_(case[2])
        q_nope.copy_(case[0])
        q_rope.copy_(case[1])
        plan(case)
        graph.replay()
        ref = mla_decode_ref(case[0].float(), case[1].float(), case[2].float(), case[3], case[4], sm_scale)
        assert rel_err(out, ref) < 1e-2, lens
