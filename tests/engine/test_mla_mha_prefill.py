"""The runner's MLA prefill in MHA form (FlashInfer ragged prefill; torch SDPA when the Triton kernels are
chosen) against the torch reference, on a DeepSeek-V2-Lite-shaped model (full width, 4 layers, dummy
weights, bf16, no CUDA graphs). Tolerances as tests/engine/test_fast_path.py: logits within 3e-2 relative
(min row cosine 0.999) of the reference in the same form, greedy agreement >= 75% over teacher-forced decode
steps. Against the absorbed-form reference 5e-2 (cosine 0.999): the two forms round differently in bf16 (the
absorbed one rounds q W_UK and the latent output), seen 3.4e-2 on the H200 for a 1-sequence prefill; the forms
agree within 1e-4 in float32 (tests/models/test_mla_forms.py), and a wrong kernel gives errors of order 1.
"""
from __future__ import annotations

import pytest
import torch

from runtime.core.mla_form import MHA_PREFIX_THRESHOLD_TOKENS
from runtime.engine.fast_path import FastPathConfig
from runtime.engine.forward_batch import ForwardBatch
from runtime.engine.model_runner import ModelRunner
from runtime.models.attention_backend import TorchAttentionBackend
from tests.engine.test_fast_path import (
    MAX_LEN, Sequences, assert_close_logits, hf_config, min_row_cosine, prompts, rel_err,
)

HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
LONG_SLOTS = MHA_PREFIX_THRESHOLD_TOKENS + 1024


def make_runner(kernel: str) -> ModelRunner:
    cfg = hf_config("deepseek_v2_lite", num_hidden_layers=4)
    fast = FastPathConfig(cuda_graph=False, mla_kernel=kernel, progress=False)
    return ModelRunner(cfg, num_kv_slots=LONG_SLOTS + 2 * 32 * MAX_LEN, device="cuda", dtype="bfloat16",
                       fast=fast)


@pytest.fixture(scope="module")
def runner():
    if not HAS_CUDA:
        pytest.skip("needs a CUDA GPU")
    return make_runner("auto")


def assert_close_to_absorbed_reference(runner: ModelRunner, fb: ForwardBatch, fast: torch.Tensor,
                                       what: str) -> None:
    fb.attn_backend = TorchAttentionBackend(mla_prefill_as_mha=False)
    ref = runner.model(fb, runner.pool)
    err, cos = rel_err(fast, ref), min_row_cosine(fast, ref)
    print(f"{what}: rel err {err:.3g}, min row cosine {cos:.5f}")
    assert err <= 5e-2 and cos >= 0.999, f"{what}: rel err {err:.3g}, min row cosine {cos:.5f}"


@gpu
@needs_cuda
@pytest.mark.parametrize("batch", [1, 5])
def test_prefill_runs_as_mha_and_matches_both_reference_forms(runner, batch: int) -> None:
    seqs = Sequences(prompts(batch, 102400, seed=300 + batch), slot_base=LONG_SLOTS, device=runner.device)
    fb = seqs.next_batch()
    ref = runner.forward(fb, "reference").clone()
    fast = runner.forward(fb, "eager").clone()
    backend = runner.attn_backend
    assert backend.mla_as_mha(fb)
    assert (backend.mha_prefill is not None) == (backend.kernel == "flashinfer")
    print(f"MHA-form prefill B={batch} vs reference: rel err {rel_err(fast, ref):.3g}")
    assert_close_logits(fast, ref, f"MHA-form prefill B={batch} vs reference")
    assert_close_to_absorbed_reference(runner, fb, fast, f"MHA-form prefill B={batch} vs absorbed reference")


@gpu
@needs_cuda
def test_greedy_agreement_after_mha_prefill(runner) -> None:
    p = prompts(8, 102400, seed=400)
    ref_seqs = Sequences(p, slot_base=LONG_SLOTS, device=runner.device)
    fast_seqs = Sequences(p, slot_base=LONG_SLOTS + 32 * MAX_LEN, device=runner.device)
    agree = total = 0
    for _ in range(17):                                   # the prefill, then 16 decode steps
        ref_ids = runner.forward(ref_seqs.next_batch(), "reference").argmax(-1).tolist()
        fast_ids = runner.forward(fast_seqs.next_batch(), "eager").argmax(-1).tolist()
        agree += sum(a == b for a, b in zip(ref_ids, fast_ids))
        total += len(p)
        ref_seqs.append(ref_ids)
        fast_seqs.append(ref_ids)
    print(f"bf16 greedy agreement after an MHA-form prefill: {agree}/{total}")
    assert agree >= 0.75 * total


@gpu
@needs_cuda
def test_extend_over_a_long_prefix_expands_it_in_one_shot(runner) -> None:
    """A summed prefix at SGLang's threshold: the prefix latents are read back from the pool and expanded."""
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 102400, (MHA_PREFIX_THRESHOLD_TOKENS + 300,), generator=gen).tolist()
    slots = list(range(len(ids)))
    first = ForwardBatch.build([(ids[:MHA_PREFIX_THRESHOLD_TOKENS], 0, slots[:MHA_PREFIX_THRESHOLD_TOKENS])],
                               runner.device)
    runner.forward(first, "eager")                        # the prefix, itself a no-prefix MHA-form prefill
    fb = ForwardBatch.build([(ids[MHA_PREFIX_THRESHOLD_TOKENS:], MHA_PREFIX_THRESHOLD_TOKENS, slots)],
                            runner.device)
    ref = runner.forward(fb, "reference").clone()
    fast = runner.forward(fb, "eager").clone()
    assert runner.attn_backend.mla_as_mha(fb)
    print(f"one-shot MHA extend vs reference: rel err {rel_err(fast, ref):.3g}")
    assert_close_logits(fast, ref, "one-shot MHA extend vs reference")
    assert_close_to_absorbed_reference(runner, fb, fast, "one-shot MHA extend vs absorbed reference")


@gpu
@needs_cuda
def test_sdpa_fallback_without_flashinfer() -> None:
    runner = make_runner("triton")
    assert runner.attn_backend.flashinfer is None
    seqs = Sequences(prompts(5, 102400, seed=500), slot_base=0, device=runner.device)
    fb = seqs.next_batch()
    ref = runner.forward(fb, "reference").clone()
    fast = runner.forward(fb, "eager").clone()
    assert runner.attn_backend.mla_as_mha(fb) and runner.attn_backend.mha_prefill is None
    assert_close_logits(fast, ref, "SDPA MHA-form prefill vs reference")
    seqs.append(ref.argmax(-1).tolist())
    fb = seqs.next_batch()                                # a decode step reads the latents it stored
    assert_close_logits(runner.forward(fb, "eager"), runner.forward(fb, "reference"), "decode after SDPA prefill")
