"""On 2 GPUs (NCCL, FlashInfer/Triton, CUDA graphs): tp=2, tp=2 ep=2 and DP attention over both GPUs (tp=2
dp=2 dp_attention, decode steps replaying graphs padded to the agreed size) serve tp=1's greedy tokens.
fp32 (Triton kernels): every token of 8 requests x 64 steps through the mode=real path (scheduler on the
leader, plan broadcast, graphs), each layout's decode steps replayed as graphs; and DP attention with
uneven ranks (one idles through most of the run, replaying padding rows) serves one GPU's tokens.
bf16 (experiments/bench_parallel.py speed --tokens) is reported, not asserted here: rounding flips
near-ties, see the README's tolerance."""
from __future__ import annotations

import argparse
import tempfile

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
        # after the prefill, every decode step of every leader is a graph replay (DP attention: 4 per rank)
        assert all(n >= steps - 2 for n in result["graph_replays_per_leader"]), (name, result)
        if name != "tp2dpa":    # the prefill replayed piecewise graphs (under tp=2 too); DP attention's runs eagerly
            assert all(n >= 1 for n in result["piecewise_replays_per_leader"]), (name, result)
    assert len(report["layouts"]["tp2dpa"]["graph_replays_per_leader"]) == 2


def test_dp_attention_graphs_pad_uneven_and_idle_ranks_to_one_size():
    """Rank 1's requests stop after 2 tokens: for the rest of the run it replays padding rows of the size
    rank 0's 3 decodes agree on (4), and rank 0's tokens must still be one GPU's."""
    from experiments.compose import compose_config
    from runtime.distributed.app import serve
    from tests.distributed.test_dp_attention import LONG_TOKENS, SHORT_TOKENS, uneven_specs

    base = ["mode=real", "model=tiny_mla_moe", "real.device=cuda", "real.dtype=float32", "real.warmup=false",
            "real.cuda_graph_max_bs=8", "real.as_fast_as_possible=true", "progress=false", "print_summary=false",
            "workload.num_groups=2", "workload.prompts_per_group=3", "workload.system_prompt_len=40",
            "workload.question_len=12", "kv.capacity_tokens=3000", "real.dist_timeout_s=120"]
    served = {}
    for name, layout in (("tp1", []), ("dpa", ["tp=2", "dp=2", "dp_attention=true"])):
        cfg = compose_config(base + layout)
        specs = uneven_specs(cfg)
        with tempfile.TemporaryDirectory() as tmp:
            results, _, _ = serve(cfg, tmp, collect_output_ids=True, specs=specs)
        served[name] = ({rid: ids for r in results.values() for rid, ids in r.output_ids.items()}, results)
    reference, _ = served["tp1"]
    tokens, results = served["dpa"]
    assert sorted(len(ids) for ids in reference.values()) == [SHORT_TOKENS] * 3 + [LONG_TOKENS] * 3
    assert tokens == reference
    idle = results[1].facts
    assert idle["idle_steps"] >= LONG_TOKENS - SHORT_TOKENS - 2
    assert idle["graph_replays"] >= idle["idle_steps"] - 2            # its idle steps replayed padding rows
    assert results[0].facts["graph_steps"] == idle["graph_steps"] >= LONG_TOKENS - SHORT_TOKENS - 2
