"""Piecewise CUDA graphs for extend/mixed steps (runtime/engine/piecewise_graph_runner.py).

CPU (Triton interpreter for the fused small ops, fp32, torch attention): the split data flow -- inputs
padded with token 0 at position 0, attention-core inputs through the static handoff buffers, cores on the
real tokens only -- gives the plain forward's logits and writes the same KV, for prefills, extends over a
cached prefix and mixed steps, MLA and GQA families.
GPU: a DeepSeek-V2-Lite-shaped model (4 layers) and Llama-shaped one (2 layers) with piecewise graphs:
replays match the eager fast path (bf16 tolerance) at every captured bucket a step pads to; fp32 with the
Triton kernels generates the reference's greedy tokens through prefill + decode.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from runtime.engine.fast_path import FastPathConfig, FusedSmallOps  # noqa: E402
from runtime.engine.forward_batch import ForwardBatch  # noqa: E402
from runtime.engine.kv_pool import create_kv_pool  # noqa: E402
from runtime.core.graph_grids import extend_token_buckets, padded_size  # noqa: E402
from runtime.engine.model_runner import ModelRunner  # noqa: E402
from runtime.engine.piecewise_graph_runner import PiecewiseGraphRunner  # noqa: E402
from runtime.models.attention_backend import TorchAttentionBackend  # noqa: E402
from runtime.models.config import ModelConfig  # noqa: E402
from runtime.models.loader import build_model  # noqa: E402
from tests.engine.test_fast_path import MAX_LEN, Sequences, assert_close_logits, hf_config, prompts  # noqa: E402
from tests.engine.test_fused_small_ops import gpu, interpreter_only, needs_cuda  # noqa: E402



def test_bucket_grid_covers_every_step_with_little_padding() -> None:
    for max_tokens in (1, 7, 256, 1000, 8192):
        grid = extend_token_buckets(max_tokens)
        assert grid == sorted(set(grid)) and grid[-1] == max_tokens and grid[0] >= 1
        for tokens in range(1, max_tokens + 1, 7):
            padded = next(b for b in grid if b >= tokens)
            bound = max(15, 0.125 * tokens) if padded <= 2048 else tokens / 16
            assert padded - tokens <= bound, (max_tokens, tokens, padded)
    assert len(extend_token_buckets(8192)) <= 80          # capture time and graph memory stay bounded
    with pytest.raises(ValueError, match=">= 1"):
        extend_token_buckets(0)


def mixed_batch(seqs: Sequences, extend_ids: list[int]) -> ForwardBatch:
    """Sequence 0 extends by extend_ids over its cached tokens; the others decode their last token."""
    items = []
    for b, (toks, cached) in enumerate(zip(seqs.tokens, seqs.cached)):
        if b == 0:
            toks.extend(extend_ids)
        items.append((toks[cached:], cached, seqs.slots(b, len(toks))))
    seqs.cached = [len(t) for t in seqs.tokens]
    return ForwardBatch.build(items, seqs.device)


def split_and_plain_steps(model, config: ModelConfig) -> tuple[list[dict], object, object]:
    """A prefill of three prompts, a decode-only step, then an extend over a cached prefix mixed with decodes,
    each through `model`'s plain forward and through the piecewise split (`run_uncaptured`, padded to its
    bucket; fused small ops on the model). Per step {bucket (None: not a piecewise step), padded, num_tokens,
    got, want}; then the split run's and the plain run's KV pools (`config`: the rank's, for their shapes)."""
    p = prompts(3, model.config.vocab_size, seed=11)
    plain_pool = create_kv_pool(config, 4 * MAX_LEN, torch.float32, "cpu")
    split_pool = create_kv_pool(config, 4 * MAX_LEN, torch.float32, "cpu")
    runner = PiecewiseGraphRunner(model, split_pool, TorchAttentionBackend(), extend_token_buckets(256),
                                  torch.device("cpu"), capture=False)
    plain_seqs, split_seqs = Sequences(p, 0, torch.device("cpu")), Sequences(p, 0, torch.device("cpu"))
    steps = []
    for make in (lambda s: s.next_batch(), lambda s: s.next_batch(), lambda s: mixed_batch(s, [5, 6, 7, 8, 9])):
        fb_plain, fb_split = make(plain_seqs), make(split_seqs)
        want = model(fb_plain, plain_pool)
        bucket = runner.bucket(fb_split)
        padded = bucket if bucket is not None else padded_size(fb_split.num_tokens, runner.buckets)
        got = runner.run_uncaptured(fb_split, padded)
        steps.append(dict(bucket=bucket, padded=padded, num_tokens=fb_split.num_tokens, got=got, want=want))
        ids = want.argmax(-1).tolist()
        plain_seqs.append(ids)
        split_seqs.append(ids)
    return steps, split_pool, plain_pool


@interpreter_only
@pytest.mark.parametrize("family", ["tiny_mla_moe", "tiny_llama"])
def test_split_forward_matches_plain_forward_fp32(family: str) -> None:
    cfg = hf_config(family)
    model = build_model(cfg, torch.float32, "cpu", seed=0)
    model.small_ops = FusedSmallOps(model)
    config = ModelConfig.from_hf(cfg)
    steps, split_pool, plain_pool = split_and_plain_steps(model, config)
    for step, result in enumerate(steps):
        # decode-only steps are the decode graphs' (or eager), as in SGLang
        assert (result["bucket"] is None) == (step == 1), (family, step)
        assert result["padded"] >= result["num_tokens"]
        torch.testing.assert_close(result["got"], result["want"], rtol=1e-4, atol=1e-4, msg=f"{family} step {step}")
    for layer in range(config.num_hidden_layers):                      # only real tokens reach the pool
        torch.testing.assert_close(split_pool.get_kv(layer), plain_pool.get_kv(layer), rtol=1e-4, atol=1e-5)


def test_split_forward_needs_the_fused_small_ops() -> None:
    model = build_model(hf_config("tiny_llama"), torch.float32, "cpu", seed=0)
    with pytest.raises(ValueError, match="fused small ops"):
        PiecewiseGraphRunner(model, None, TorchAttentionBackend(), [8], torch.device("cpu"), capture=False)


def test_cpu_runner_captures_no_piecewise_graphs() -> None:
    runner = ModelRunner(hf_config("tiny_mla_moe"), num_kv_slots=4 * MAX_LEN, device="cpu", dtype="float32",
                         fast=FastPathConfig(piecewise_cuda_graph=True))
    assert runner.piecewise is None


# -- GPU -------------------------------------------------------------------------------------------------
BUCKETS = (16, 64, 256, 1024)


def piecewise_runner(model: str, layers: int, dtype: str, **fast) -> ModelRunner:
    cfg = hf_config(model, num_hidden_layers=layers)
    config = FastPathConfig(cuda_graph_max_bs=32, piecewise_cuda_graph=True, piecewise_token_buckets=BUCKETS,
                            progress=False, **fast)
    return ModelRunner(cfg, num_kv_slots=2 * 32 * MAX_LEN, device="cuda", dtype=dtype, fast=config)


@gpu
@needs_cuda
@pytest.mark.parametrize("model,layers", [("deepseek_v2_lite", 4), ("llama3_8b", 2)])
def test_piecewise_replay_matches_eager_bf16(model: str, layers: int) -> None:
    runner = piecewise_runner(model, layers, "bfloat16")
    assert runner.piecewise is not None and sorted(runner.piecewise.pieces) == list(BUCKETS)
    assert all(len(p) == layers + 1 for p in runner.piecewise.pieces.values())   # one split per layer
    vocab = runner.model.config.vocab_size
    for batch, seed in ((1, 1), (5, 2), (24, 3)):                      # prefills padded to 64, 256, 1024
        p = prompts(batch, vocab, seed=seed)
        eager_seqs = Sequences(p, slot_base=0, device=runner.device)
        graph_seqs = Sequences(p, slot_base=32 * MAX_LEN, device=runner.device)
        for step in range(3):                                          # prefill, decode, extend + decodes
            make = (lambda s: s.next_batch()) if step < 2 else (lambda s: mixed_batch(s, list(range(3, 40))))
            fb_eager, fb_graph = make(eager_seqs), make(graph_seqs)
            if step != 1:
                assert runner.piecewise.bucket(fb_graph) is not None
            eager = runner.forward(fb_eager, "eager").clone()
            graph = runner.forward(fb_graph, "auto").clone()
            assert_close_logits(graph, eager, f"{model} batch {batch} step {step}")
            ref_ids = eager.argmax(-1).tolist()
            eager_seqs.append(ref_ids)
            graph_seqs.append(ref_ids)


@gpu
@needs_cuda
def test_piecewise_padding_leaves_other_slots_alone() -> None:
    runner = piecewise_runner("deepseek_v2_lite", 2, "bfloat16")
    before = runner.pool.get_kv(0).clone()
    seqs = Sequences(prompts(3, 102400, seed=5), slot_base=0, device=runner.device)
    fb = seqs.next_batch()
    written = fb.out_cache_loc.clone()
    assert runner.piecewise.bucket(fb) > fb.num_tokens                 # padded
    runner.forward(fb, "auto")
    after = runner.pool.get_kv(0)
    untouched = torch.ones(after.shape[0], dtype=torch.bool, device=after.device)
    untouched[written] = False
    assert torch.equal(after[untouched], before[untouched])


@gpu
@needs_cuda
def test_piecewise_greedy_identical_fp32() -> None:
    runner = piecewise_runner("deepseek_v2_lite", 4, "float32", mla_kernel="triton")
    p = prompts(20, 102400, seed=7)
    ref_seqs = Sequences(p, slot_base=0, device=runner.device)
    fast_seqs = Sequences(p, slot_base=32 * MAX_LEN, device=runner.device)
    for step in range(17):
        ref_fb, fast_fb = ref_seqs.next_batch(), fast_seqs.next_batch()
        ref_ids = runner.forward(ref_fb, "reference").argmax(-1).tolist()
        logits = runner.forward(fast_fb, "auto")
        ref_seqs.append(ref_ids)
        fast_seqs.append(logits.argmax(-1).tolist())
    assert fast_seqs.tokens == ref_seqs.tokens
