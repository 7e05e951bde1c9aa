"""The fast path of MHA/GQA models (Llama, Qwen2-MoE): FastGQABackend + fused small ops (+ fused MoE with the
gated shared expert) against the torch reference path of the same model.

CPU (Triton interpreter, fp32): the fused model path with the Triton attention kernel equals the reference
(logits and the KV written); family dispatch of `make_graph_backend`; kernel choice.
GPU (`gpu` marker):
- bf16, Llama-3-8B and Qwen2-MoE at full width with 2 layers (dummy weights), FlashInfer: eager logits vs
  the reference within bf16 tolerance (rel err <= 3e-2, row cosine >= 0.999; a wrong kernel gives errors of
  order 1), greedy agreement over 32 teacher-forced steps >= 75% (exact identity is not asserted in bf16:
  with random weights over a 128k/152k vocab the top-2 gap is of the order of bf16 rounding differences).
- fp32, tiny_llama- and Qwen2-MoE-shaped models with the Triton kernel (FlashInfer has no fp32): free-running
  greedy tokens identical to the reference for 32 decode steps.
- a decode step captured with torch.cuda.graph through `make_graph_backend` (FlashInfer graph mode and the
  Triton kernel) replays the eager logits for new lengths, and padding rows write only the dummy slot.
- an 8,192-token prefill of Llama-3-8B-shaped layers allocates far less than one T x T score matrix.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from runtime.engine.fast_path import FastMLABackend, FastPathConfig, FusedSmallOps  # noqa: E402
from runtime.engine.forward_batch import ForwardBatch  # noqa: E402
from runtime.engine.gqa_backend import (  # noqa: E402
    FastGQABackend, choose_gqa_kernel, gqa_shape, make_graph_backend,
)
from runtime.engine.kv_pool import create_kv_pool  # noqa: E402
from runtime.engine.model_runner import ModelRunner  # noqa: E402
from runtime.models.config import ModelConfig  # noqa: E402
from runtime.models.loader import build_model  # noqa: E402
from runtime.models.moe import MoE  # noqa: E402
from runtime.models.rotary import apply_rotary  # noqa: E402
from tests.engine.test_fast_path import (  # noqa: E402
    MAX_LEN, Sequences, assert_close_logits, hf_config, prompts,
)

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
interpreter_only = pytest.mark.skipif(HAS_CUDA, reason="CPU-interpreter test; the gpu tests cover CUDA")
TINY_QWEN2_MOE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24,
                      shared_expert_intermediate_size=48, vocab_size=512, max_position_embeddings=512,
                      mlp_only_layers=[1])
TINY = {"tiny_llama": ("tiny_llama", {}), "tiny_qwen2_moe": ("qwen2_moe", TINY_QWEN2_MOE)}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_config(name: str) -> dict:
    model, overrides = TINY[name]
    return hf_config(model, **overrides)


# -- CPU -------------------------------------------------------------------------------------------
def run_steps(model, pool, p: list[list[int]], steps: int, backend) -> list[torch.Tensor]:
    seqs, out = Sequences(p, 0, model.device), []
    for _ in range(steps + 1):
        fb = seqs.next_batch()
        fb.attn_backend = backend
        logits = model(fb, pool)
        out.append(logits)
        seqs.append(logits.argmax(-1).tolist())
    return out


@interpreter_only
@pytest.mark.parametrize("name", sorted(TINY))
def test_fused_gqa_path_matches_reference_fp32(name: str) -> None:
    cfg = tiny_config(name)
    model = build_model(cfg, torch.float32, "cpu", seed=0)
    config = ModelConfig.from_hf(cfg)
    p = prompts(3, config.vocab_size, seed=11)
    ref_pool = create_kv_pool(config, 4 * MAX_LEN, torch.float32, "cpu")
    ref = run_steps(model, ref_pool, p, steps=2, backend=None)
    model.small_ops = FusedSmallOps(model)
    backend = FastGQABackend(gqa_shape(model, torch.float32), "triton", torch.device("cpu"))
    fast_pool = create_kv_pool(config, 4 * MAX_LEN, torch.float32, "cpu")
    fast = run_steps(model, fast_pool, p, steps=2, backend=backend)
    for step, (a, b) in enumerate(zip(fast, ref)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=f"{name} step {step}")
    for layer in range(config.num_hidden_layers):
        for got, want in zip(fast_pool.get_kv(layer), ref_pool.get_kv(layer)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"{name} layer {layer} KV")


@interpreter_only
def test_fused_rotary_covers_positions_past_the_config_maximum() -> None:
    """tiny_llama's max_position_embeddings is 2,048; a longer context still gets the reference's angles."""
    model = build_model(tiny_config("tiny_llama"), torch.float32, "cpu", seed=0)
    ops = FusedSmallOps(model)
    assert ops.cos_sin_cache.shape[0] > 100_000 > model.config.max_position_embeddings
    positions = torch.tensor([0, 2047, 2048, 9000, 100_000])
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(5, 4, 16, generator=gen), torch.randn(5, 2, 16, generator=gen)
    cos, sin = model.rotary.cos_sin(positions)
    want_q, want_k = apply_rotary(q, cos, sin, False), apply_rotary(k, cos, sin, False)
    ops.rope(positions, q, k, interleaved=False)
    torch.testing.assert_close(q, want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k, want_k, rtol=1e-5, atol=1e-5)


@interpreter_only
def test_backend_rejects_a_foreign_scale_and_mla() -> None:
    model = build_model(tiny_config("tiny_llama"), torch.float32, "cpu", seed=0)
    backend = FastGQABackend(gqa_shape(model, torch.float32), "triton", torch.device("cpu"))
    pool = create_kv_pool(model.config, 8, torch.float32, "cpu")
    fb = ForwardBatch.build([([1, 2], 0, [0, 1])], "cpu")
    q, kv = torch.zeros(2, 4, 16), torch.zeros(2, 2, 16)
    with pytest.raises(ValueError):
        backend.mha(0, q, kv, kv, fb, pool, scale=0.5)
    with pytest.raises(TypeError):
        backend.mla(0, q, q, kv, kv, fb, pool, scale=0.25)


def test_make_graph_backend_picks_the_family() -> None:
    gqa_model = build_model(tiny_config("tiny_llama"), torch.float32, "cpu", seed=0)
    mla_model = build_model(hf_config("tiny_mla_moe"), torch.float32, "cpu", seed=0)
    gqa = make_graph_backend(gqa_model, torch.float32, torch.device("cpu"), 8, 1024, kernel="triton")
    mla = make_graph_backend(mla_model, torch.float32, torch.device("cpu"), 8, 1024, kernel="triton")
    assert isinstance(gqa, FastGQABackend) and isinstance(mla, FastMLABackend)
    assert not gqa.auto_plan and not mla.auto_plan and gqa.flashinfer is None and mla.flashinfer is None
    assert (gqa.shape.num_heads, gqa.shape.num_kv_heads, gqa.shape.head_dim) == (4, 2, 16)


def test_choose_gqa_kernel() -> None:
    shape = gqa_shape(build_model(tiny_config("tiny_llama"), torch.float32, "cpu", seed=0), torch.float32)
    assert choose_gqa_kernel("triton", shape) == "triton"
    with pytest.warns(UserWarning):
        assert choose_gqa_kernel("auto", shape) == "triton"          # fp32 and head_dim 16: no FlashInfer
    with pytest.raises(RuntimeError):
        choose_gqa_kernel("flashinfer", shape)
    with pytest.raises(ValueError):
        choose_gqa_kernel("cutlass", shape)


# -- GPU: bf16 at full width, FlashInfer -----------------------------------------------------------
FULL = {"llama3_8b": 128256, "qwen2_moe": 151936}    # model -> vocab


@pytest.fixture(scope="module", params=sorted(FULL))
def bf16_runner(request):
    if not HAS_CUDA:
        pytest.skip("needs a CUDA GPU")
    cfg = hf_config(request.param, num_hidden_layers=2)
    runner = ModelRunner(cfg, num_kv_slots=2 * 32 * MAX_LEN, device="cuda", dtype="bfloat16",
                         fast=FastPathConfig(cuda_graph=False, progress=False))
    runner.name = request.param
    return runner


@gpu
@needs_cuda
def test_fast_path_is_wired_for_gqa_models(bf16_runner) -> None:
    from kernels.gqa_attention.flashinfer_gqa import flashinfer_available

    runner = bf16_runner
    assert isinstance(runner.attn_backend, FastGQABackend)
    assert runner.attn_backend.kernel == ("flashinfer" if flashinfer_available() else "triton")
    assert isinstance(runner.model.small_ops, FusedSmallOps)
    moe = [m for m in runner.model.modules() if isinstance(m, MoE)]
    # the router rows plus Qwen2-MoE's shared-expert gate row; the shared experts stacked after the routed ones
    assert all(m.fused_router_weight().shape[0] == m.gate.config.num_experts + 1 for m in moe)
    assert all(m.experts.w13.shape[0] == m.gate.config.num_experts + m.num_fused_shared > m.gate.config.num_experts
               for m in moe)
    assert bool(moe) == (runner.name == "qwen2_moe")


@gpu
@needs_cuda
@pytest.mark.parametrize("batch", [1, 5])
def test_logits_match_reference_bf16(bf16_runner, batch: int) -> None:
    runner = bf16_runner
    seqs = Sequences(prompts(batch, FULL[runner.name], seed=batch), slot_base=0, device=runner.device)
    fb = seqs.next_batch()
    ref = runner.forward(fb, "reference").clone()
    assert_close_logits(runner.forward(fb, "eager"), ref, f"{runner.name} prefill B={batch}")
    seqs.append(ref.argmax(-1).tolist())
    for step in range(3):
        fb = seqs.next_batch()
        ref = runner.forward(fb, "reference").clone()
        assert_close_logits(runner.forward(fb, "eager"), ref, f"{runner.name} decode B={batch} step {step}")
        seqs.append(ref.argmax(-1).tolist())


@gpu
@needs_cuda
def test_greedy_agreement_bf16(bf16_runner) -> None:
    """Teacher-forced with the reference's tokens (both paths see the same history, in separate slots)."""
    runner, batch = bf16_runner, 8
    p = prompts(batch, FULL[runner.name], seed=300)
    ref_seqs = Sequences(p, slot_base=0, device=runner.device)
    fast_seqs = Sequences(p, slot_base=32 * MAX_LEN, device=runner.device)
    agree = total = 0
    for _ in range(33):
        ref_ids = runner.forward(ref_seqs.next_batch(), "reference").argmax(-1).tolist()
        fast_ids = runner.forward(fast_seqs.next_batch(), "eager").argmax(-1).tolist()
        agree += sum(a == b for a, b in zip(ref_ids, fast_ids))
        total += batch
        ref_seqs.append(ref_ids)
        fast_seqs.append(ref_ids)
    print(f"{runner.name} bf16 greedy agreement: {agree}/{total}")
    assert agree >= 0.75 * total, f"{runner.name} greedy agreement {agree}/{total}"


# -- GPU: fp32, Triton attention, exact greedy identity --------------------------------------------
@gpu
@needs_cuda
@pytest.mark.parametrize("name", sorted(TINY))
@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_identical_fp32(name: str, batch: int) -> None:
    runner = ModelRunner(tiny_config(name), num_kv_slots=2 * 8 * MAX_LEN, device="cuda", dtype="float32",
                         fast=FastPathConfig(cuda_graph=False, mla_kernel="triton", progress=False))
    assert isinstance(runner.attn_backend, FastGQABackend) and runner.attn_backend.kernel == "triton"
    p = prompts(batch, runner.model.config.vocab_size, seed=400 + batch)
    tokens = {}
    for path, base in (("reference", 0), ("eager", 8 * MAX_LEN)):
        seqs = Sequences(p, slot_base=base, device=runner.device)
        for _ in range(33):
            seqs.append(runner.forward(seqs.next_batch(), path).argmax(-1).tolist())
        tokens[path] = seqs.tokens
    assert tokens["eager"] == tokens["reference"]


# -- GPU: one decode step in a CUDA graph ----------------------------------------------------------
@gpu
@needs_cuda
@pytest.mark.parametrize("kernel", ["auto", "triton"])
def test_decode_step_replays_in_a_cuda_graph(bf16_runner, kernel: str) -> None:
    """The graph-mode backend captured the way the CUDA-graph runner does it (static inputs, plan outside,
    capture on a side stream) gives the eager logits for B = 5 padded to 8, over two steps."""
    from runtime.engine.cuda_graph_runner import DecodeGraphInputs

    runner, batch, padded = bf16_runner, 5, 8
    model, pool, device = runner.model, runner.pool, runner.device
    dummy = pool.num_slots - 1                                   # never handed to the test's sequences
    max_kv = padded * MAX_LEN
    backend = make_graph_backend(model, runner.dtype, device, padded, max_kv, kernel=kernel)
    inputs = DecodeGraphInputs(padded, max_kv, dummy, device)
    gfb = inputs.forward_batch(padded)
    gfb.attn_backend = backend
    logits = torch.zeros(padded, model.config.vocab_size, dtype=torch.float32, device=device)

    def plan(kv_indptr: list[int]) -> None:
        if backend.flashinfer is not None:
            lens = [b - a for a, b in zip(kv_indptr, kv_indptr[1:])]
            backend.plan_flashinfer(torch.arange(padded + 1, dtype=torch.int32),
                                    torch.tensor(kv_indptr, dtype=torch.int32), inputs.kv_indices[:kv_indptr[-1]],
                                    torch.tensor(lens, dtype=torch.int32), causal=False)

    def step() -> None:
        logits.copy_(model(gfb, pool))

    plan(inputs.fill_dummy(padded))
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        step()
        step()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        step()

    seqs = Sequences(prompts(batch, FULL[runner.name], seed=500), slot_base=0, device=device)
    seqs.append(runner.forward(seqs.next_batch(), "eager").argmax(-1).tolist())
    for _ in range(2):
        fb = seqs.next_batch()
        eager = runner.forward(fb, "eager").clone()
        kv_before = [t.clone() for t in pool.get_kv(1)]
        plan(inputs.fill(fb, padded))
        graph.replay()
        assert_close_logits(logits[:batch], eager, f"{runner.name} {kernel} graph replay")
        allowed = set(fb.out_cache_loc.tolist()) | {dummy}
        for before, after in zip(kv_before, pool.get_kv(1)):
            changed = (before != after).flatten(1).any(-1).nonzero().flatten().tolist()
            assert set(changed) <= allowed, f"replay wrote slots {set(changed) - allowed}"
        seqs.append(eager.argmax(-1).tolist())


# -- GPU: no T x T allocation ----------------------------------------------------------------------
@gpu
@needs_cuda
def test_long_prefill_allocates_no_score_matrix() -> None:
    """8,192 new tokens through Llama-3-8B-shaped layers: the reference would hold a [32, T, T] float32 score
    matrix (8.6 GB); the fast path's peak stays at the size of the MLP activations (< 2 GiB)."""
    num_tokens = 8192
    runner = ModelRunner(hf_config("llama3_8b", num_hidden_layers=2), num_kv_slots=2 * num_tokens, device="cuda",
                         dtype="bfloat16", fast=FastPathConfig(cuda_graph=False, progress=False))
    runner.warmup([64])                                          # JIT compile outside the measurement
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    runner.warmup([num_tokens])                                  # the prefill (and one decode) of mode=real's warm-up
    peak_gib = (torch.cuda.max_memory_allocated() - before) / 2**30
    print(f"llama3_8b 2-layer prefill of {num_tokens} tokens: peak +{peak_gib:.2f} GiB")
    assert peak_gib < 2.0, f"peak +{peak_gib:.2f} GiB during an {num_tokens}-token prefill"
