"""MLA prefill in MHA form (k/v expanded from the latents): the torch SDPA fallback and FlashInfer's ragged
prefill against kernels/mla_attention/ref.py's mla_mha_prefill_ref.

CPU: the SDPA fallback in float32, tiny shapes, with and without a prefix (bottom-right causal), v a strided
view; the Triton k = [k_nope | k_pe] concat in Triton's interpreter (TRITON_INTERPRET=1, set below before the
kernel module is imported). GPU (`gpu`): bfloat16 at DeepSeek's dims (16 heads, Dqk 192, Dv 128). Tolerance: relative Frobenius
error <= 1e-2 against the float32-math reference -- bf16 inputs and a bf16 output round at ~2e-3 per element,
a wrong mask or scale gives errors of order 0.1-1.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernels.mla_attention.flashinfer_mla import flashinfer_available  # noqa: E402
from kernels.mla_attention.ref import mla_mha_prefill_ref  # noqa: E402
from kernels.mla_attention.sdpa_prefill import mha_prefill_sdpa  # noqa: E402
from kernels.mla_attention.triton_concat_k import concat_mla_k_triton  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
needs_flashinfer = pytest.mark.skipif(not (HAS_CUDA and flashinfer_available()), reason="needs flashinfer + GPU")
BF16_TOL = 1e-2


def make_inputs(q_lens, prefix_lens, heads, dqk, dv, dtype, device, seed=0):
    """q [T, N, Dqk]; k [K, N, Dqk]; v [K, N, Dv] a strided view of a [K, N, Dqk' + Dv] buffer (as the
    model slices kv_b_proj's output); host CSR offsets."""
    gen = torch.Generator().manual_seed(seed)
    kv_lens = [q + p for q, p in zip(q_lens, prefix_lens)]
    qo_indptr, kv_indptr = [0], [0]
    for q, k in zip(q_lens, kv_lens):
        qo_indptr.append(qo_indptr[-1] + q)
        kv_indptr.append(kv_indptr[-1] + k)
    q = torch.randn(qo_indptr[-1], heads, dqk, generator=gen).to(dtype).to(device)
    k = torch.randn(kv_indptr[-1], heads, dqk, generator=gen).to(dtype).to(device)
    kv = torch.randn(kv_indptr[-1], heads, 16 + dv, generator=gen).to(dtype).to(device)
    return q, k, kv[..., 16:], qo_indptr, kv_indptr


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


CASES = [([5], [0]), ([3, 1, 7], [0, 0, 0]), ([4, 2], [6, 0]), ([1, 3], [9, 2])]


@pytest.mark.parametrize("q_lens,prefix_lens", CASES)
def test_sdpa_fallback_matches_ref_fp32(q_lens, prefix_lens):
    q, k, v, qo, kv = make_inputs(q_lens, prefix_lens, 3, 24, 16, torch.float32, "cpu")
    assert not v.is_contiguous()
    ref = mla_mha_prefill_ref(q, k, v, torch.tensor(qo), torch.tensor(kv), 0.2)
    out = mha_prefill_sdpa(q, k, v, qo, kv, 0.2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_ref_is_bottom_right_causal():
    """The last new token of a sequence sees all its KV, the first sees only the prefix and itself."""
    q, k, v, qo, kv = make_inputs([3], [4], 1, 8, 8, torch.float32, "cpu", seed=1)
    out = mla_mha_prefill_ref(q, k, v, torch.tensor(qo), torch.tensor(kv), 0.5)
    for i, seen in ((0, 5), (2, 7)):
        probs = torch.softmax(q[i, 0] @ k[:seen, 0].T * 0.5, dim=-1)
        torch.testing.assert_close(out[i, 0], probs @ v[:seen, 0])


@pytest.mark.parametrize("heads", [1, 3, 16, 20])
def test_triton_concat_k_matches_torch_cat(heads):
    device = "cuda" if HAS_CUDA else "cpu"
    dtype = torch.bfloat16 if HAS_CUDA else torch.float32        # a copy: exact in any dtype
    gen = torch.Generator().manual_seed(heads)
    kv = torch.randn(37, heads, 16 + 8, generator=gen).to(dtype).to(device)       # [K, N, Dn + Dv]
    latent = torch.randn(37, 32 + 4, generator=gen).to(dtype).to(device)         # [K, C + R]
    k_nope, k_pe = kv[..., :16], latent[:, 32:]                                   # strided views, as the model
    expected = torch.cat([k_nope, k_pe[:, None, :].expand(-1, heads, -1)], dim=-1)
    assert torch.equal(concat_mla_k_triton(k_nope, k_pe), expected)


GPU_CASES = [([2048], [0]), ([1000] * 3 + [192], [0] * 4), ([808, 1000, 384], [192, 0, 0]),
             ([300, 1, 64], [1500, 20, 0])]


@gpu
@needs_cuda
@pytest.mark.parametrize("q_lens,prefix_lens", GPU_CASES[:2])
def test_sdpa_fallback_matches_ref_bf16(q_lens, prefix_lens):
    q, k, v, qo, kv = make_inputs(q_lens, prefix_lens, 16, 192, 128, torch.bfloat16, "cuda")
    ref = mla_mha_prefill_ref(q, k, v, torch.tensor(qo), torch.tensor(kv), 192 ** -0.5)
    assert rel_err(mha_prefill_sdpa(q, k, v, qo, kv, 192 ** -0.5), ref) <= BF16_TOL


@gpu
@needs_flashinfer
@pytest.mark.parametrize("q_lens,prefix_lens", GPU_CASES)
def test_flashinfer_mha_prefill_matches_ref_bf16(q_lens, prefix_lens):
    from kernels.mla_attention.flashinfer_mha_prefill import FlashInferMHAPrefill

    scale = 192 ** -0.5 * 1.3
    prefill = FlashInferMHAPrefill("cuda")
    _, _, _, qo, kv = make_inputs(q_lens, prefix_lens, 16, 192, 128, torch.bfloat16, "cuda")
    prefill.plan(torch.tensor(qo, dtype=torch.int32), torch.tensor(kv, dtype=torch.int32), 16, 192, 128,
                 scale, torch.bfloat16)
    for seed in (0, 1):                                  # one plan serves every layer of the step
        q, k, v, _, _ = make_inputs(q_lens, prefix_lens, 16, 192, 128, torch.bfloat16, "cuda", seed=seed)
        ref = mla_mha_prefill_ref(q, k, v, torch.tensor(qo), torch.tensor(kv), scale)
        out = prefill.run(q, k, v)
        assert out.shape == ref.shape and out.dtype == torch.bfloat16
        err = rel_err(out, ref)
        print(f"FlashInfer MHA prefill {q_lens} prefix {prefix_lens}: rel err {err:.2e}")
        assert err <= BF16_TOL
