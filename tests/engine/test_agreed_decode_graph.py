"""The decode graph a DP-attention round agrees on, on one GPU (fp32, Triton MLA): a batch replayed at a
larger agreed size than its own (padded with dummy-slot rows), with idle replays of padding rows only in
between (an idle rank's step), generates the reference path's greedy tokens; the runner replays exactly the
agreed size and counts every replay. Collectives inside the graphs are tested on 2 GPUs
(tests/distributed/test_gpu_layouts.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from runtime.engine.fast_path import FastPathConfig  # noqa: E402
from runtime.engine.model_runner import ModelRunner  # noqa: E402
from tests.engine.test_fast_path import MAX_LEN, Sequences, hf_config, prompts  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
STEPS = 24


def test_padded_and_idle_replays_of_the_agreed_size_keep_the_greedy_tokens() -> None:
    cfg = hf_config("deepseek_v2_lite", num_hidden_layers=4)
    fast = FastPathConfig(cuda_graph_batch_sizes=(1, 2, 4, 8), mla_kernel="triton", progress=False)
    runner = ModelRunner(cfg, num_kv_slots=2 * 8 * MAX_LEN, device="cuda", dtype="float32", fast=fast)
    p = prompts(3, cfg["vocab_size"], seed=7)
    reference = Sequences(p, slot_base=0, device=runner.device)
    for _ in range(STEPS + 1):
        reference.append(runner.forward(reference.next_batch(), "reference").argmax(-1).tolist())
    seqs = Sequences(p, slot_base=8 * MAX_LEN, device=runner.device)
    seqs.append(runner.forward(seqs.next_batch()).argmax(-1).tolist())    # prefill: eager
    runner.set_step_graph(None)                                           # from now on: the agreed sizes
    start = runner.graphs.num_replays
    for step in range(STEPS):
        runner.set_step_graph(8)                      # 3 sequences, padded to 8 (their own size would be 4)
        runner.idle_step()                            # a round this rank sits out: 8 padding rows
        seqs.append(runner.forward(seqs.next_batch()).argmax(-1).tolist())
    assert runner.graphs.num_replays - start == 2 * STEPS
    assert seqs.tokens == reference.tokens
    runner.set_step_graph(None)                       # an eager round: no replay, same tokens
    logits = runner.forward(seqs.next_batch())
    assert runner.graphs.num_replays - start == 2 * STEPS and logits.shape == (3, cfg["vocab_size"])
