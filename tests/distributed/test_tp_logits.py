"""Tensor and expert parallelism on CPU (gloo, 2 ranks): the sharded model gives the logits of the
whole model (fp32, <= 1e-5 relative) on every rank, for dummy weights and for safetensors checkpoints
of every family, through prefills, decodes and an extend over a cached prefix."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

torch = pytest.importorskip("torch")

from experiments.compose import compose_config  # noqa: E402
from runtime.distributed.sharding import SINGLE, ModelParallel  # noqa: E402
from runtime.engine.forward_batch import ForwardBatch  # noqa: E402
from runtime.engine.kv_pool import create_kv_pool  # noqa: E402
from runtime.engine.model_runner import rank_config  # noqa: E402
from runtime.models.loader import build_model  # noqa: E402
from runtime.distributed.spawn import run_on_ranks  # noqa: E402

RTOL = 1e-5


def tiny(name: str) -> dict:
    return OmegaConf.to_container(compose_config([f"model={name}"]).model.hf_config, resolve=True)


def forward_steps(model) -> list[torch.Tensor]:
    """Prefill two sequences, three greedy decodes, then an extend of a third sequence over the first
    one's first 5 tokens (a radix-cache hit); logits [B, V] of every step."""
    vocab = model.config.vocab_size
    pool = create_kv_pool(rank_config(model.config, model), 512, torch.float32, "cpu")
    gen = torch.Generator().manual_seed(7)
    a, b = (torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (9, 6))
    seqs = {"a": (a, list(range(0, 9))), "b": (b, list(range(100, 106)))}
    logits = [model(ForwardBatch.build([(a, 0, seqs["a"][1]), (b, 0, seqs["b"][1])], "cpu"), pool)]
    for step in range(3):
        nxt = logits[-1].argmax(-1).tolist()
        batch = []
        for (name, (ids, slots)), token in zip(seqs.items(), nxt):
            slot = slots[-1] + 1
            batch.append(([token], len(ids), slots + [slot]))
            seqs[name] = (ids + [token], slots + [slot])
        logits.append(model(ForwardBatch.build(batch, "cpu"), pool))
    c = torch.randint(0, vocab, (4,), generator=gen).tolist()
    logits.append(model(ForwardBatch.build([(c, 5, list(range(0, 5)) + list(range(200, 204)))], "cpu"), pool))
    return logits


def build(case: dict, parallel: ModelParallel):
    if case.get("path"):
        return build_model(None, torch.float32, "cpu", load_format="safetensors", path=case["path"], parallel=parallel)
    return build_model(case["hf_config"], torch.float32, "cpu", seed=0, parallel=parallel)


def sharded_logits(info, groups, cases: list[dict]) -> list[list[torch.Tensor]]:
    out = []
    for case in cases:
        parallel = ModelParallel(info.tp_rank, info.tp, case["ep"], groups.comm())
        out.append(forward_steps(build(case, parallel)))
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from tests.models.hf_models import make_hf_model, save_hf_model
    torch.manual_seed(0)
    return {family: str(save_hf_model(make_hf_model(family), tmp_path_factory.mktemp(family)))
            for family in ("deepseek_v2", "deepseek_v3", "qwen2_moe", "llama")}


@pytest.fixture(scope="module")
def cases(checkpoints) -> list[dict]:
    mla, llama = tiny("tiny_mla_moe"), tiny("tiny_llama")
    out = [dict(id="tiny_mla_moe tp2", hf_config=mla, ep=1), dict(id="tiny_mla_moe tp2 ep2", hf_config=mla, ep=2),
           dict(id="tiny_llama tp2", hf_config=llama, ep=1)]
    for family, path in checkpoints.items():
        out.append(dict(id=f"{family} checkpoint tp2", path=path, ep=1))
        if family != "llama":
            out.append(dict(id=f"{family} checkpoint tp2 ep2", path=path, ep=2))
    return out


@pytest.fixture(scope="module")
def two_ranks(cases) -> list[list[list[torch.Tensor]]]:
    return [[[torch.from_numpy(x) for x in steps] for steps in per_case] for per_case in run_on_ranks(sharded_logits, 2, cases)]


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / a.abs().max())


def test_sharded_logits_match_the_whole_model(cases, two_ranks):
    with_one_thread = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        worst = {}
        for i, case in enumerate(cases):
            whole = forward_steps(build(case, SINGLE))
            for rank, per_rank in enumerate(two_ranks):
                for step, (ref, got) in enumerate(zip(whole, per_rank[i])):
                    assert got.shape == ref.shape, (case["id"], rank, step)
                    worst[(case["id"], rank, step)] = relative_error(ref, got)
            # every rank holds the same gathered logits, bit for bit
            assert all(torch.equal(x, y) for x, y in zip(two_ranks[0][i], two_ranks[1][i])), case["id"]
    finally:
        torch.set_num_threads(with_one_thread)
    print(f"worst relative error {max(worst.values()):.2e}")
    bad = {k: v for k, v in worst.items() if v > RTOL}
    assert not bad, bad
    assert max(worst.values()) > 0      # the sharded sums really ran in another order (not a copy of tp=1)
