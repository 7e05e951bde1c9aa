"""Paged GQA attention kernels (Triton, FlashInfer) against the torch reference in kernels/gqa_attention/ref.py.

Without CUDA the Triton kernel runs in Triton's CPU interpreter (TRITON_INTERPRET=1 is set before any kernel
module is imported); the interpreter computes bfloat16 dots wrongly, so CPU tests use float32/float16 and tiny
shapes. `gpu` tests use bfloat16 at Llama-3-8B's (32 q heads, 8 KV heads, D=128) and Qwen2-MoE's (16/16)
shapes and allow 1e-2 relative error (bf16 inputs and outputs; a wrong mask or head mapping gives errors of
order 1), and check that a captured decode (FlashInfer graph mode) replays correctly for new KV lengths.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernels.gqa_attention.flashinfer_gqa import FlashInferGQA, flashinfer_available  # noqa: E402
from kernels.gqa_attention.ref import gqa_attention_ref  # noqa: E402
from kernels.gqa_attention.triton_attention import gqa_attention_triton  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
needs_flashinfer = pytest.mark.skipif(not (HAS_CUDA and flashinfer_available()), reason="needs flashinfer + GPU")
BF16_REL_ERR = 1e-2


def make_batch(q_lens, prefix_lens, num_heads, num_kv_heads, head_dim, dtype, device, seed=0, spare_slots=37):
    """Random pool; each sequence's prefix + new tokens at shuffled, non-contiguous slots."""
    gen = torch.Generator().manual_seed(seed)
    kv_lens = [q + p for q, p in zip(q_lens, prefix_lens)]
    num_slots = sum(kv_lens) + spare_slots
    k_cache = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen).to(dtype).to(device)
    v_cache = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen).to(dtype).to(device)
    kv_indices = torch.randperm(num_slots, generator=gen)[:sum(kv_lens)].to(torch.int32).to(device)
    qo_indptr = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    kv_indptr = torch.tensor([0] + torch.tensor(kv_lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=gen).to(dtype).to(device)
    return q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.float()
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-12)).item()


# ---------------------------------------------------------------- reference semantics (CPU)
def test_ref_decode_sees_every_kv_token_and_causal_extend_sees_its_prefix() -> None:
    """One-hot values make the attention weights visible: the causal mask is bottom-right aligned."""
    q_len, prefix = 3, 2
    kv_len = q_len + prefix
    q = torch.zeros(q_len, 2, 8)                                        # equal scores: uniform over visible
    k_cache = torch.zeros(kv_len, 1, 8)
    v_cache = torch.eye(8)[:kv_len].unsqueeze(1)                          # value j = one-hot j
    qo, kv = torch.tensor([0, q_len]), torch.tensor([0, kv_len])
    out = gqa_attention_ref(q, k_cache, v_cache, qo, kv, torch.arange(kv_len), 1.0, causal=True)
    for i in range(q_len):
        visible = prefix + i + 1
        expected = torch.zeros(8)
        expected[:visible] = 1 / visible
        assert torch.allclose(out[i, 0], expected) and torch.allclose(out[i, 1], expected)
    full = gqa_attention_ref(q, k_cache, v_cache, qo, kv, torch.arange(kv_len), 1.0, causal=False)
    assert torch.allclose(full[0, 0, :kv_len], torch.full((kv_len,), 1 / kv_len))


# ---------------------------------------------------------------- Triton: CPU interpreter or GPU, fp32/fp16
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(4, 2, 32), (3, 3, 16), (8, 1, 24)])
@pytest.mark.parametrize("causal", [True, False])
def test_triton_extend_matches_ref(dtype, num_heads, num_kv_heads, head_dim, causal) -> None:
    q_lens, prefix_lens = [5, 1, 19], [0, 9, 3]                         # a prefill, a decode, an extend
    args = make_batch(q_lens, prefix_lens, num_heads, num_kv_heads, head_dim, dtype, DEVICE)
    scale = head_dim ** -0.5
    out = gqa_attention_triton(*args, scale, max_q_len=max(q_lens), causal=causal)
    ref = gqa_attention_ref(*args, scale, causal=causal)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 1), (4, 4)])
def test_triton_decode_matches_ref(num_heads, num_kv_heads) -> None:
    """max_q_len = 1 (the CUDA-graph launch shape): one query per sequence over long, ragged KV."""
    q_lens, prefix_lens = [1, 1, 1, 1], [1, 70, 129, 33]
    args = make_batch(q_lens, prefix_lens, num_heads, num_kv_heads, 32, torch.float32, DEVICE, seed=3)
    out = gqa_attention_triton(*args, 0.2, max_q_len=1)
    torch.testing.assert_close(out, gqa_attention_ref(*args, 0.2), rtol=1e-5, atol=1e-5)


def test_triton_writes_into_out_and_reads_strided_q() -> None:
    q, k_cache, v_cache, qo, kv, idx = make_batch([6, 2], [0, 4], 4, 2, 16, torch.float32, DEVICE, seed=5)
    wide = torch.zeros(q.shape[0], 4, 40, device=DEVICE)                 # q as a row-strided view
    wide[..., 8:24] = q
    out = torch.full_like(q, float("nan"))
    got = gqa_attention_triton(wide[..., 8:24], k_cache, v_cache, qo, kv, idx, 0.25, max_q_len=6, out=out)
    assert got is out
    torch.testing.assert_close(out, gqa_attention_ref(q, k_cache, v_cache, qo, kv, idx, 0.25), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- GPU: bf16, FlashInfer and Triton
GPU_SHAPES = [(32, 8, 128), (16, 16, 128)]    # Llama-3-8B (group 4), Qwen2-MoE (MHA)


@gpu
@needs_cuda
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", GPU_SHAPES)
def test_triton_bf16_gpu(num_heads, num_kv_heads, head_dim) -> None:
    q_lens, prefix_lens = [300, 1, 77, 1], [0, 900, 513, 5]
    args = make_batch(q_lens, prefix_lens, num_heads, num_kv_heads, head_dim, torch.bfloat16, "cuda")
    out = gqa_attention_triton(*args, head_dim ** -0.5, max_q_len=300)
    assert rel_err(out, gqa_attention_ref(*args, head_dim ** -0.5)) < BF16_REL_ERR


@gpu
@needs_flashinfer
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", GPU_SHAPES)
@pytest.mark.parametrize("backend", ["fa2"])     # fa3 (Hopper) is timed by bench.py --fa3; its JIT build is long
def test_flashinfer_extend_matches_ref(num_heads, num_kv_heads, head_dim, backend) -> None:
    q_lens, prefix_lens = [300, 1, 77, 2], [0, 900, 513, 5]            # mixed: a decode row inside an extend
    q, k_cache, v_cache, qo, kv, idx = make_batch(q_lens, prefix_lens, num_heads, num_kv_heads, head_dim,
                                                  torch.bfloat16, "cuda")
    gqa = FlashInferGQA("cuda", prefill_backend=backend)
    scale = head_dim ** -0.5
    gqa.plan(qo.cpu(), kv.cpu(), idx, None, num_heads, num_kv_heads, head_dim, scale,
             torch.bfloat16, torch.bfloat16, causal=True)
    err = rel_err(gqa.run(q, k_cache, v_cache), gqa_attention_ref(q, k_cache, v_cache, qo, kv, idx, scale))
    assert err < BF16_REL_ERR, f"{backend} extend rel err {err:.3g}"


@gpu
@needs_flashinfer
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", GPU_SHAPES)
@pytest.mark.parametrize("tensor_cores", [None, True, False])
def test_flashinfer_decode_matches_ref(num_heads, num_kv_heads, head_dim, tensor_cores) -> None:
    kv_lens = [1, 17, 4096, 333, 1000]
    q, k_cache, v_cache, qo, kv, idx = make_batch([1] * 5, [n - 1 for n in kv_lens], num_heads, num_kv_heads,
                                                  head_dim, torch.bfloat16, "cuda", seed=1)
    gqa = FlashInferGQA("cuda", decode_tensor_cores=tensor_cores)
    scale = head_dim ** -0.5
    gqa.plan(qo.cpu(), kv.cpu(), idx, torch.tensor(kv_lens, dtype=torch.int32), num_heads, num_kv_heads,
             head_dim, scale, torch.bfloat16, torch.bfloat16, causal=False)
    err = rel_err(gqa.run(q, k_cache, v_cache), gqa_attention_ref(q, k_cache, v_cache, qo, kv, idx, scale))
    assert err < BF16_REL_ERR, f"decode (tensor cores {tensor_cores}) rel err {err:.3g}"


@gpu
@needs_flashinfer
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", GPU_SHAPES)
def test_flashinfer_graph_decode_replays_new_lengths(num_heads, num_kv_heads, head_dim) -> None:
    """Capture run() once, then re-plan (outside the graph) for other KV lengths and slots and replay."""
    batch, scale = 4, head_dim ** -0.5
    gqa = FlashInferGQA("cuda", use_cuda_graph=True, max_batch_size=8, max_kv_tokens=8 * 2048)
    q_static = torch.zeros(batch, num_heads, head_dim, dtype=torch.bfloat16, device="cuda")
    out_static = torch.zeros_like(q_static)
    num_slots = 4 * 2048 + 64
    k_cache = torch.randn(num_slots, num_kv_heads, head_dim, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.randn_like(k_cache)

    def plan(kv_lens: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        gen = torch.Generator(device="cuda").manual_seed(seed)
        idx = torch.randperm(num_slots, device="cuda", generator=gen)[:sum(kv_lens)].to(torch.int32)
        kv = torch.tensor([0] + torch.tensor(kv_lens).cumsum(0).tolist(), dtype=torch.int32)
        gqa.plan(torch.arange(batch + 1, dtype=torch.int32), kv, idx, torch.tensor(kv_lens, dtype=torch.int32),
                 num_heads, num_kv_heads, head_dim, scale, torch.bfloat16, torch.bfloat16, causal=False)
        q_static.copy_(torch.randn(batch, num_heads, head_dim, device="cuda", generator=gen))
        return torch.arange(batch + 1, dtype=torch.int32, device="cuda"), kv.cuda(), idx

    plan([5, 9, 1, 30], seed=0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        gqa.run(q_static, k_cache, v_cache, out=out_static)              # warm-up (JIT) outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        gqa.run(q_static, k_cache, v_cache, out=out_static)
    for seed, kv_lens in enumerate([[2048, 1, 700, 64], [3, 1500, 1, 2000]], start=1):
        qo, kv, idx = plan(kv_lens, seed)
        graph.replay()
        ref = gqa_attention_ref(q_static, k_cache, v_cache, qo, kv, idx, scale)
        assert rel_err(out_static, ref) < BF16_REL_ERR, f"replay with KV lengths {kv_lens}"
