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
from tests.engine.test_fused_small_ops import interpreter_only  # noqa: E402


def split_vs_plain(info, groups, family: str, ep: int) -> dict:
    """On one rank: max |split - plain| / max |plain| of every step's logits, the largest KV difference, and
    the padding rows of every step."""
    from omegaconf import OmegaConf

    from runtime.distributed.sharding import ModelParallel
    from runtime.engine.fast_path import FusedSmallOps
    from runtime.engine.model_runner import rank_config
    from runtime.models.loader import build_model
    from tests.engine.test_piecewise_graphs import split_and_plain_steps

    torch.set_num_threads(1)
    hf = OmegaConf.to_container(compose_config([f"model={family}"]).model.hf_config, resolve=True)
    parallel = ModelParallel(info.tp_rank, info.tp, ep, groups.comm())
    model = build_model(hf, torch.float32, "cpu", seed=0, parallel=parallel)
    model.small_ops = FusedSmallOps(model)
    config = rank_config(model.config, model)
    steps, split_pool, plain_pool = split_and_plain_steps(model, config)

    def tensors(kv) -> tuple:                  # MLA: one latent tensor a layer; GQA: (k, v)
        return kv if isinstance(kv, tuple) else (kv,)

    kv = max(float((a - b).abs().max()) for layer in range(config.num_hidden_layers)
             for a, b in zip(tensors(split_pool.get_kv(layer)), tensors(plain_pool.get_kv(layer))))
    return {"logits": [float((s["got"] - s["want"]).abs().max() / s["want"].abs().max()) for s in steps],
            "kv": kv, "padding": [s["padded"] - s["num_tokens"] for s in steps]}


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
