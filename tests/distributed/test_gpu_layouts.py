"""On 2 GPUs (NCCL, FlashInfer/Triton, CUDA graphs): tp=2, tp=2 ep=2 and DP attention over both GPUs (tp=2
dp=2 dp_attention, eager) serve tp=1's greedy tokens.
fp32 (Triton kernels): every token of 8 requests x 64 steps through the mode=real path (scheduler on the
leader, plan broadcast, graphs). bf16 (experiments/bench_parallel.py speed --tokens) is reported, not
asserted here: rounding flips near-ties, see the README's tolerance."""
from __future__ import annotations

import argparse

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="needs 2 CUDA GPUs")]


@pytest.mark.parametrize("model,steps", [("tiny_mla_moe", 16), ("deepseek_v2_lite", 64)])
def test_tp2_ep2_and_dp_attention_serve_the_greedy_tokens_of_tp1(model, steps, tmp_path):
    from experiments.bench_parallel import run_tokens

    args = argparse.Namespace(model=model, layouts=["tp1", "tp2", "tp2ep2", "tp2dpa"], device="cuda", dtype="float32",
                              requests=8, steps=steps, prompt_len=128)
    report = run_tokens(args, tmp_path)
    assert set(report["layouts"]) == {"tp1", "tp2", "tp2ep2", "tp2dpa"}
    for name, result in report["layouts"].items():
        assert result["tokens_equal"] == result["tokens"] == 8 * steps, (name, result)
