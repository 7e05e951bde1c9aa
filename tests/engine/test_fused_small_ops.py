"""The fused-small-ops model path (FusedSmallOps: Triton add+RMSNorm, RMSNorm, SiLU-and-mul, rotary)
against the torch reference path of the same model, float32.

Without CUDA the Triton kernels run in Triton's CPU interpreter: TRITON_INTERPRET=1 is set below before
any kernel module is imported (triton.jit reads it at decoration time). The GPU test runs the runner
with the fast path in bf16 and checks the small ops are on and that switching them off for a reference
forward is undone afterwards.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from runtime.engine.fast_path import FastPathConfig, FusedSmallOps, torch_reference_small_ops  # noqa: E402
from runtime.engine.kv_pool import create_kv_pool  # noqa: E402
from runtime.engine.model_runner import ModelRunner  # noqa: E402
from runtime.models.config import ModelConfig  # noqa: E402
from runtime.models.layers import GatedMLP  # noqa: E402
from runtime.models.loader import build_model  # noqa: E402
from runtime.models.moe import select_experts  # noqa: E402
from runtime.models.rotary import apply_rotary  # noqa: E402
from tests.engine.test_fast_path import MAX_LEN, Sequences, hf_config, prompts  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
# these pass CPU tensors to Triton kernels, which only Triton's interpreter accepts (CI, no GPU)
interpreter_only = pytest.mark.skipif(HAS_CUDA, reason="CPU-interpreter test; the gpu tests cover CUDA")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run_steps(model, pool, p: list[list[int]], steps: int) -> list[torch.Tensor]:
    """Logits of a prefill then `steps` greedy decode steps (the fused and reference runs share tokens
    only through their own argmax; the test compares logits step by step)."""
    seqs, out = Sequences(p, 0, torch.device("cpu")), []
    for _ in range(steps + 1):
        logits = model(seqs.next_batch(), pool)
        out.append(logits)
        seqs.append(logits.argmax(-1).tolist())
    return out


@interpreter_only
@pytest.mark.parametrize("family", ["tiny_mla_moe", "tiny_llama"])
def test_fused_small_ops_match_reference_fp32(family: str) -> None:
    cfg = hf_config(family)
    model = build_model(cfg, torch.float32, "cpu", seed=0)
    config = ModelConfig.from_hf(cfg)
    p = prompts(3, config.vocab_size, seed=7)
    ref_pool = create_kv_pool(config, 4 * MAX_LEN, torch.float32, "cpu")
    ref = run_steps(model, ref_pool, p, steps=2)
    model.small_ops = FusedSmallOps(model)
    fused_pool = create_kv_pool(config, 4 * MAX_LEN, torch.float32, "cpu")
    fused = run_steps(model, fused_pool, p, steps=2)
    for step, (a, b) in enumerate(zip(fused, ref)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=f"{family} step {step}")
    for layer in range(config.num_hidden_layers):                  # the KV written (latent, or k and v)
        got, want = fused_pool.get_kv(layer), ref_pool.get_kv(layer)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"{family} layer {layer} KV")
    with torch_reference_small_ops(model):            # the switch restores the reference exactly
        assert model.small_ops is None
        again = run_steps(model, create_kv_pool(config, 4 * MAX_LEN, torch.float32, "cpu"), p, steps=2)
    assert all(torch.equal(a, b) for a, b in zip(again, ref))
    assert isinstance(model.small_ops, FusedSmallOps)


@interpreter_only
@pytest.mark.parametrize("interleaved", [True, False])
def test_fused_rope_matches_torch_rotary(interleaved: bool) -> None:
    """Rotary convention: the Triton kernel with the model's cos/sin table equals apply_rotary of
    runtime/models/rotary.py on DeepSeek's strided q-rope / k-rope views (q into a contiguous buffer)."""
    model = build_model(hf_config("tiny_mla_moe"), torch.float32, "cpu", seed=0)
    ops = FusedSmallOps(model)
    gen = torch.Generator().manual_seed(0)
    num_tokens, heads, nope, rope, latent = 5, 4, 16, 8, 32
    positions = torch.tensor([0, 3, 17, 511, 2047])
    q = torch.randn(num_tokens, heads, nope + rope, generator=gen)
    kv = torch.randn(num_tokens, latent + rope, generator=gen)
    cos, sin = model.rotary.cos_sin(positions)
    want_q = apply_rotary(q[..., nope:], cos, sin, interleaved)
    want_k = apply_rotary(kv[:, latent:], cos, sin, interleaved)
    q_before, q_out = q.clone(), torch.empty(num_tokens, heads, rope)
    ops.rope(positions, q[..., nope:], kv[:, latent:], interleaved, q_out=q_out)
    torch.testing.assert_close(q_out, want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kv[:, latent:], want_k, rtol=1e-5, atol=1e-5)
    assert torch.equal(q, q_before)                   # q only read when q_out is given


def test_cos_sin_cache_holds_the_reference_angles() -> None:
    model = build_model(hf_config("tiny_mla_moe"), torch.float32, "cpu", seed=0)
    cache = model.rotary.cos_sin_cache(64)
    cos, sin = model.rotary.cos_sin(torch.arange(64))
    assert torch.equal(cache, torch.cat([cos, sin], dim=-1))


@interpreter_only
def test_shared_expert_add_in_down_gemm() -> None:
    torch.manual_seed(0)
    mlp = GatedMLP(16, 24, False, torch.float32, "cpu")
    for p in mlp.parameters():
        p.normal_()
    x, routed = torch.randn(6, 16), torch.randn(6, 16)
    ops = FusedSmallOps(build_model(hf_config("tiny_mla_moe"), torch.float32, "cpu", seed=0))
    torch.testing.assert_close(mlp.forward_add(x, routed.clone(), ops), routed + mlp(x), rtol=1e-5, atol=1e-4)


def test_router_scale_one_is_skipped_bit_identically() -> None:
    logits = torch.randn(7, 8)
    w, ids = select_experts(logits, 2, routed_scaling_factor=1.0)
    w2, ids2 = select_experts(logits, 2, routed_scaling_factor=2.5)
    assert torch.equal(ids, ids2) and torch.equal(w * 2.5, w2)
    assert torch.equal(w, logits.softmax(-1).gather(1, ids))


# -- GPU -----------------------------------------------------------------------------------------------
@gpu
@needs_cuda
def test_runner_uses_fused_small_ops_and_reference_switches_them_off() -> None:
    cfg = hf_config("deepseek_v2_lite", num_hidden_layers=2)
    fast = FastPathConfig(cuda_graph_batch_sizes=(1, 4), progress=False)
    runner = ModelRunner(cfg, num_kv_slots=8 * MAX_LEN, device="cuda", dtype="bfloat16", fast=fast)
    assert isinstance(runner.model.small_ops, FusedSmallOps)
    seqs = Sequences(prompts(4, 102400, seed=3), 0, runner.device)
    fb = seqs.next_batch()
    ref = runner.forward(fb, "reference").clone()
    assert isinstance(runner.model.small_ops, FusedSmallOps)
    eager = runner.forward(fb, "eager")
    err = ((eager - ref).norm() / ref.norm()).item()
    assert err < 3e-2, f"fused eager vs reference rel err {err:.3g}"
    off = ModelRunner(cfg, num_kv_slots=8 * MAX_LEN, device="cuda", dtype="bfloat16",
                      fast=FastPathConfig(fused_small_ops=False, cuda_graph=False))
    assert off.model.small_ops is None
