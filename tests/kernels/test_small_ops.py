"""Small ops (norm, activation, rotary, KV store): Triton and FlashInfer against kernels/small_ops/ref.py.

Without CUDA the Triton kernels run in Triton's CPU interpreter: TRITON_INTERPRET=1 is set below before
any kernel module is imported (triton.jit reads it at decoration time). CPU tests use float32/float16;
`gpu` tests use bfloat16 and FlashInfer (skipped when absent). Rotary conventions are also checked
against Hugging Face's DeepSeek code when transformers is installed.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernels.small_ops import ref  # noqa: E402
from kernels.small_ops.rope_cache import (  # noqa: E402
    deepseek_yarn_cos_sin_cache, rope_cos_sin_cache, yarn_get_mscale, yarn_inv_freq,
)
from kernels.small_ops.triton_act import silu_and_mul_triton  # noqa: E402
from kernels.small_ops.triton_kv_store import store_kv_triton, store_mla_kv_triton  # noqa: E402
from kernels.small_ops.triton_norm import fused_add_rmsnorm_triton, rmsnorm_triton  # noqa: E402
from kernels.small_ops.triton_rope import rope_triton  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
CPU_DTYPES = [torch.float32, torch.float16]
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


def _flashinfer_ok() -> bool:
    if not HAS_CUDA:
        return False
    try:
        import flashinfer  # noqa: F401
    except Exception:
        return False
    return True


needs_flashinfer = pytest.mark.skipif(not _flashinfer_ok(), reason="needs flashinfer + GPU")


def randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


def close(out, expected, dtype):
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(out.float(), expected.float(), rtol=tol, atol=tol)


# ---------------------------------------------------------------- norm
@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("hidden", [96, 1000])
def test_rmsnorm(dtype, hidden):
    x, w = randn(5, hidden, dtype=dtype), randn(hidden, dtype=dtype, seed=1)
    close(rmsnorm_triton(x, w, 1e-6), ref.rmsnorm_ref(x, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("inplace", [True, False])
def test_fused_add_rmsnorm(dtype, inplace):
    x, res, w = randn(4, 200, dtype=dtype), randn(4, 200, dtype=dtype, seed=1), randn(200, dtype=dtype, seed=2)
    want_out, want_res = ref.fused_add_rmsnorm_ref(x, res, w, 1e-6)
    x_in, res_in = x.clone(), res.clone()
    out, new_res = fused_add_rmsnorm_triton(x_in, res_in, w, 1e-6, inplace=inplace)
    close(out, want_out, dtype)
    close(new_res, want_res, dtype)
    if inplace:
        assert out.data_ptr() == x_in.data_ptr() and new_res.data_ptr() == res_in.data_ptr()
    else:
        assert torch.equal(x_in, x) and torch.equal(res_in, res)


# ---------------------------------------------------------------- activation
@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("inter", [70, 1500])
def test_silu_and_mul(dtype, inter):
    gate_up = randn(3, 2 * inter, dtype=dtype)
    close(silu_and_mul_triton(gate_up), ref.silu_and_mul_ref(gate_up), dtype)


# ---------------------------------------------------------------- rotary
@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("is_neox_style", [True, False])
def test_rope_in_place_on_views(dtype, is_neox_style):
    """q_rope is the tail of a wider q (as MLA produces it); k_rope is one head given as [T, R]."""
    cache = deepseek_yarn_cos_sin_cache(16, 128, 10000.0, 40.0, 64, mscale=0.707, mscale_all_dim=0.707).to(DEVICE)
    positions = torch.tensor([0, 5, 127, 64, 3], device=DEVICE)
    q_full, k = randn(5, 3, 48, dtype=dtype), randn(5, 16, dtype=dtype, seed=1)
    q_nope_before = q_full[..., :32].clone()
    want_q = ref.rope_ref(positions, q_full[..., 32:], cache, is_neox_style)
    want_k = ref.rope_ref(positions, k, cache, is_neox_style)
    rope_triton(positions, q_full[..., 32:], k, cache, is_neox_style)
    close(q_full[..., 32:], want_q, dtype)
    close(k, want_k, dtype)
    assert torch.equal(q_full[..., :32], q_nope_before)


def test_rope_ref_position_zero_is_identity_and_norm_preserving():
    cache = rope_cos_sin_cache(16, 32)
    x = torch.randn(2, 4, 16)
    for neox in (True, False):
        torch.testing.assert_close(ref.rope_ref(torch.zeros(2, dtype=torch.long), x, cache, neox), x)
        rotated = ref.rope_ref(torch.tensor([7, 31]), x, cache, neox)
        torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))


def test_rope_conventions_match_huggingface_deepseek():
    """SGLang's interleaved style == HF DeepSeek-V2 exactly, == HF DeepSeek-V3 up to de-interleaving."""
    try:
        from transformers.models.deepseek_v2.modeling_deepseek_v2 import apply_rotary_emb
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb_interleave
    except ImportError:
        pytest.skip("transformers without DeepSeek rotary helpers")
    rope_dim, seq = 16, 6
    cache = rope_cos_sin_cache(rope_dim, 64)
    positions = torch.arange(3, 3 + seq)
    q, k = torch.randn(1, 2, seq, rope_dim), torch.randn(1, 1, seq, rope_dim)      # HF layout [b, h, s, d]
    ours_q = ref.rope_ref(positions, q[0].transpose(0, 1), cache, False).transpose(0, 1)[None]
    ours_k = ref.rope_ref(positions, k[0].transpose(0, 1), cache, False).transpose(0, 1)[None]
    cos_half, sin_half = cache[positions, : rope_dim // 2], cache[positions, rope_dim // 2:]
    hf_q2, hf_k2 = apply_rotary_emb(q, k, torch.complex(cos_half, sin_half)[None])
    torch.testing.assert_close(hf_q2, ours_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hf_k2, ours_k, rtol=1e-5, atol=1e-5)
    cos, sin = torch.cat([cos_half, cos_half], -1)[None], torch.cat([sin_half, sin_half], -1)[None]
    hf_q3, hf_k3 = apply_rotary_pos_emb_interleave(q, k, cos, sin)
    deinterleave = torch.cat([torch.arange(0, rope_dim, 2), torch.arange(1, rope_dim, 2)])
    torch.testing.assert_close(hf_q3, ours_q[..., deinterleave], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hf_k3, ours_k[..., deinterleave], rtol=1e-5, atol=1e-5)


def test_yarn_matches_huggingface():
    try:
        from transformers import DeepseekV3Config
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        params = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
                  "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}
        config = DeepseekV3Config(qk_rope_head_dim=64, max_position_embeddings=163840, rope_parameters=params)
        hf_inv_freq, hf_attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    except Exception as exc:  # transformers absent, or an older config API (rope_scaling)
        pytest.skip(f"HF yarn not comparable here: {exc!r}")
    torch.testing.assert_close(yarn_inv_freq(64, 10000.0, 40.0, 4096), hf_inv_freq.float())
    cache = deepseek_yarn_cos_sin_cache(64, 8, 10000.0, 40.0, 4096, mscale=0.707, mscale_all_dim=0.707)
    assert abs(cache[0, 0].item() - hf_attention_factor) < 1e-6
    assert yarn_get_mscale(40.0, 0.707) > 1.0


# ---------------------------------------------------------------- KV store
@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_store_mla_kv(dtype):
    kv_cache = torch.zeros(40, 48, dtype=dtype, device=DEVICE)
    expected = kv_cache.clone()
    slots = torch.randperm(40, generator=torch.Generator().manual_seed(0))[:6].to(DEVICE)
    c_kv, k_rope = randn(6, 32, dtype=dtype), randn(6, 16, dtype=dtype, seed=1)
    store_mla_kv_triton(kv_cache, slots, c_kv, k_rope)
    ref.store_mla_kv_ref(expected, slots, c_kv, k_rope)
    assert torch.equal(kv_cache, expected)


def test_store_kv_heads():
    k_cache, v_cache = torch.zeros(30, 2, 16, device=DEVICE), torch.zeros(30, 2, 8, device=DEVICE)
    k_want, v_want = k_cache.clone(), v_cache.clone()
    slots = torch.tensor([29, 0, 7], dtype=torch.int32, device=DEVICE)
    k, v = randn(3, 2, 16), randn(3, 2, 8, seed=1)
    store_kv_triton(k_cache, v_cache, slots, k, v)
    ref.store_rows_ref(k_want, slots, k)
    ref.store_rows_ref(v_want, slots, v)
    assert torch.equal(k_cache, k_want) and torch.equal(v_cache, v_want)


# ---------------------------------------------------------------- GPU, bf16, Triton and FlashInfer
@gpu
@needs_cuda
def test_triton_small_ops_bf16_gpu():
    bf16 = torch.bfloat16
    x, res, w = randn(33, 7168, dtype=bf16), randn(33, 7168, dtype=bf16, seed=1), randn(7168, dtype=bf16, seed=2)
    close(rmsnorm_triton(x, w, 1e-6), ref.rmsnorm_ref(x, w, 1e-6), bf16)
    out, new_res = fused_add_rmsnorm_triton(x.clone(), res.clone(), w, 1e-6)
    want_out, want_res = ref.fused_add_rmsnorm_ref(x, res, w, 1e-6)
    close(out, want_out, bf16)
    close(new_res, want_res, bf16)
    gate_up = randn(33, 2 * 1408, dtype=bf16)
    close(silu_and_mul_triton(gate_up), ref.silu_and_mul_ref(gate_up), bf16)
    cache = deepseek_yarn_cos_sin_cache(64, 4096, 10000.0, 40.0, 4096, mscale=0.707, mscale_all_dim=0.707).cuda()
    positions = torch.randint(0, 4096, (33,), device="cuda")
    for neox in (True, False):
        q_full, k = randn(33, 128, 192, dtype=bf16), randn(33, 64, dtype=bf16, seed=3)
        want_q = ref.rope_ref(positions, q_full[..., 128:], cache, neox)
        want_k = ref.rope_ref(positions, k, cache, neox)
        rope_triton(positions, q_full[..., 128:], k, cache, neox)
        close(q_full[..., 128:], want_q, bf16)
        close(k, want_k, bf16)
    kv_cache = torch.zeros(1000, 576, dtype=bf16, device="cuda")
    expected = kv_cache.clone()
    slots = torch.randperm(1000, device="cuda")[:33]
    c_kv, k_rope = randn(33, 512, dtype=bf16), randn(33, 64, dtype=bf16, seed=4)
    store_mla_kv_triton(kv_cache, slots, c_kv, k_rope)
    ref.store_mla_kv_ref(expected, slots, c_kv, k_rope)
    assert torch.equal(kv_cache, expected)


@gpu
@needs_flashinfer
def test_flashinfer_small_ops_bf16():
    from kernels.small_ops.flashinfer_ops import (
        fused_add_rmsnorm_flashinfer, rmsnorm_flashinfer, rope_flashinfer, silu_and_mul_flashinfer,
    )
    bf16 = torch.bfloat16
    x, res, w = randn(33, 2048, dtype=bf16), randn(33, 2048, dtype=bf16, seed=1), randn(2048, dtype=bf16, seed=2)
    close(rmsnorm_flashinfer(x, w, 1e-6), ref.rmsnorm_ref(x, w, 1e-6), bf16)
    out, new_res = fused_add_rmsnorm_flashinfer(x.clone(), res.clone(), w, 1e-6)
    want_out, want_res = ref.fused_add_rmsnorm_ref(x, res, w, 1e-6)
    close(out, want_out, bf16)
    close(new_res, want_res, bf16)
    gate_up = randn(33, 2 * 1408, dtype=bf16)
    close(silu_and_mul_flashinfer(gate_up), ref.silu_and_mul_ref(gate_up), bf16)
    cache = deepseek_yarn_cos_sin_cache(64, 4096, 10000.0, 40.0, 4096, mscale=0.707, mscale_all_dim=0.707).cuda()
    positions = torch.randint(0, 4096, (33,), device="cuda")
    for neox in (True, False):
        q, k = randn(33, 16, 64, dtype=bf16), randn(33, 64, dtype=bf16, seed=3)
        want_q, want_k = ref.rope_ref(positions, q, cache, neox), ref.rope_ref(positions, k, cache, neox)
        rope_flashinfer(positions, q, k, cache, neox)
        close(q, want_q, bf16)
        close(k, want_k, bf16)
