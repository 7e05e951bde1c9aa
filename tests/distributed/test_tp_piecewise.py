"""Piecewise CUDA graphs under tensor parallelism (CPU, gloo, 2 ranks, Triton interpreter, fp32): the split
data flow a replay runs -- inputs padded to a bucket, the pieces between attention cores holding the layers'
all-reduces, each rank's attention core on its own heads over the real tokens -- gives, on every rank, the
logits of the sharded model's plain forward and writes the same KV, through a prefill, a decode-only step and
an extend over a cached prefix mixed with decodes (tp=2, and tp=2 ep=2 for the MoE model). The bucket rule
(`runtime.build.piecewise_graph_tokens`) is the same for tp=1 and tp>1, and none under DP attention."""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")       # inherited by the spawned ranks

from experiments.compose import compose_config  # noqa: E402
from runtime.build import piecewise_graph_tokens  # noqa: E402
from runtime.distributed.spawn import run_on_ranks  # noqa: E402

interpreter_only = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter test; the gpu tests cover CUDA")


def split_vs_plain(info, groups, family: str, ep: int) -> dict:
    """On one rank: max |split - plain| / max |plain| over the steps' logits and over the KV pools."""
    from omegaconf import OmegaConf

    from runtime.core.graph_grids import extend_token_buckets, padded_size
    from runtime.distributed.sharding import ModelParallel
    from runtime.engine.fast_path import FusedSmallOps
    from runtime.engine.kv_pool import create_kv_pool
    from runtime.engine.model_runner import rank_config
    from runtime.engine.piecewise_graph_runner import PiecewiseGraphRunner
    from runtime.models.attention_backend import TorchAttentionBackend
    from runtime.models.loader import build_model
    from tests.engine.test_fast_path import MAX_LEN, Sequences, prompts
    from tests.engine.test_piecewise_graphs import mixed_batch

    torch.set_num_threads(1)
    hf = OmegaConf.to_container(compose_config([f"model={family}"]).model.hf_config, resolve=True)
    parallel = ModelParallel(info.tp_rank, info.tp, ep, groups.comm())
    model = build_model(hf, torch.float32, "cpu", seed=0, parallel=parallel)
    model.small_ops = FusedSmallOps(model)
    config = rank_config(model.config, model)
    plain_pool, split_pool = (create_kv_pool(config, 4 * MAX_LEN, torch.float32, "cpu") for _ in range(2))
    runner = PiecewiseGraphRunner(model, split_pool, TorchAttentionBackend(), extend_token_buckets(256),
                                  torch.device("cpu"), capture=False)
    p = prompts(3, model.config.vocab_size, seed=11)
    plain_seqs, split_seqs = Sequences(p, 0, torch.device("cpu")), Sequences(p, 0, torch.device("cpu"))
    errors, padded_counts = [], []
    for make in (lambda s: s.next_batch(), lambda s: s.next_batch(), lambda s: mixed_batch(s, [5, 6, 7, 8, 9])):
        fb_plain, fb_split = make(plain_seqs), make(split_seqs)
        want = model(fb_plain, plain_pool)
        padded = runner.bucket(fb_split) or padded_size(fb_split.num_tokens, runner.buckets)
        padded_counts.append(padded - fb_split.num_tokens)
        got = runner.run_uncaptured(fb_split, padded)
        errors.append(float((got - want).abs().max() / want.abs().max()))
        ids = want.argmax(-1).tolist()
        plain_seqs.append(ids)
        split_seqs.append(ids)
    def tensors(kv) -> tuple:                  # MLA: one latent tensor a layer; GQA: (k, v)
        return kv if isinstance(kv, tuple) else (kv,)

    kv = max(float((a - b).abs().max()) for layer in range(config.num_hidden_layers)
             for a, b in zip(tensors(split_pool.get_kv(layer)), tensors(plain_pool.get_kv(layer))))
    return {"logits": errors, "kv": kv, "padding": padded_counts}


@interpreter_only
@pytest.mark.parametrize("family,ep", [("tiny_mla_moe", 1), ("tiny_mla_moe", 2), ("tiny_llama", 1)])
def test_split_forward_under_tp2_matches_the_sharded_plain_forward(family: str, ep: int) -> None:
    per_rank = run_on_ranks(split_vs_plain, 2, family, ep, timeout_s=900)
    for rank, result in enumerate(per_rank):
        assert max(result["logits"]) <= 1e-5, (family, ep, rank, result)
        assert result["kv"] <= 1e-5, (family, ep, rank, result)
        assert any(n > 0 for n in result["padding"]), result          # padding rows really ran through the pieces


def test_every_tp_captures_the_same_buckets_and_dp_attention_none() -> None:
    base = ["mode=real", "model=tiny_mla_moe", "scheduler.chunked_prefill_size=1024"]
    one = piecewise_graph_tokens(compose_config(base))
    assert one == 1024
    assert piecewise_graph_tokens(compose_config(base + ["tp=2"])) == one
    assert piecewise_graph_tokens(compose_config(base + ["tp=2", "ep=2"])) == one
    assert piecewise_graph_tokens(compose_config(base + ["tp=2", "dp=2", "dp_attention=true"])) == 0
    assert piecewise_graph_tokens(compose_config(base + ["tp=2", "real.piecewise_cuda_graph=false"])) == 0
