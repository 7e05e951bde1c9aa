"""Weight sharding without processes: every rank's parameters are pieces of the tp=1 model's (dummy
init and checkpoint loading), GQA KV heads are replicated past num_key_value_heads ranks, experts
are partitioned by ep, and bad degrees fail naming the dimension."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

torch = pytest.importorskip("torch")

from experiments.compose import compose_config  # noqa: E402
from runtime.distributed.sharding import ModelParallel, Piece, ShardSpec, Split, shard_spec  # noqa: E402
from runtime.models.loader import build_model  # noqa: E402


class NoComm:
    def all_reduce(self, x):
        raise AssertionError("no collective at build time")

    all_gather_last = all_reduce


def tiny(name: str) -> dict:
    return OmegaConf.to_container(compose_config([f"model={name}"]).model.hf_config, resolve=True)


def shards(hf: dict, tp: int, ep: int = 1) -> list:
    return [build_model(hf, torch.float32, "cpu", seed=3, parallel=ModelParallel(r, tp, ep, NoComm()))
            for r in range(tp)]


@pytest.mark.parametrize("name,tp,ep", [("tiny_mla_moe", 2, 1), ("tiny_mla_moe", 2, 2), ("tiny_mla_moe", 4, 2),
                                        ("tiny_llama", 2, 1), ("tiny_llama", 4, 1)])
def test_every_rank_holds_pieces_of_the_whole_model(name, tp, ep):
    hf = tiny(name)
    whole = dict(build_model(hf, torch.float32, "cpu", seed=3).named_parameters())
    for model in shards(hf, tp, ep):
        params = dict(model.named_parameters())
        assert params.keys() == whole.keys()
        for key, param in params.items():
            spec = shard_spec(param)
            expected = whole[key] if spec is None else spec.narrow(whole[key])
            assert torch.equal(param, expected), key


def test_rank_sizes_follow_the_layout():
    hf = tiny("tiny_mla_moe")                   # 4 heads, 8 experts, moe_intermediate 32, vocab 512
    tp2 = shards(hf, 2)[1]
    layer = tp2.model.layers[1]
    assert layer.self_attn.num_heads == 2 and layer.self_attn.q_proj.weight.shape[0] == 2 * 24
    assert layer.self_attn.kv_a_proj_with_mqa.weight.shape == (32 + 8, 64)     # latent path whole
    assert layer.mlp.experts.w13.shape == (8, 2 * 16, 64)                       # experts split along I
    assert tp2.lm_head.weight.shape == (256, 64) and tp2.model.embed_tokens.weight.shape == (256, 64)
    ep2 = shards(hf, 2, ep=2)[1]
    experts = ep2.model.layers[1].mlp.experts
    assert experts.w13.shape == (4, 2 * 32, 64) and list(experts.global_ids()) == [4, 5, 6, 7]
    assert ep2.model.layers[1].mlp.shared_experts.gate_up_proj.weight.shape == (2 * 16, 64)   # shared: TP split


def test_gqa_kv_heads_replicate_past_their_count():
    hf = tiny("tiny_llama")                     # 4 query heads, 2 KV heads, head dim 16
    whole = build_model(hf, torch.float32, "cpu", seed=3)
    k_whole = whole.model.layers[0].self_attn.qkv_proj.shard(whole.model.layers[0].self_attn.qkv_proj.weight, 1)
    for rank, model in enumerate(shards(hf, 4)):
        attn = model.model.layers[0].self_attn
        assert (attn.num_heads, attn.num_kv_heads) == (1, 1)
        kv_head = rank * 2 // 4                 # query head r reads KV head r // (N / Hkv)
        assert torch.equal(attn.qkv_proj.shard(attn.qkv_proj.weight, 1), k_whole[kv_head * 16:(kv_head + 1) * 16])


def test_row_parallel_bias_lives_on_the_first_rank():
    hf = dict(tiny("tiny_llama"), attention_bias=True)
    ranks = shards(hf, 2)
    whole = build_model(hf, torch.float32, "cpu", seed=3)
    whole.model.layers[0].self_attn.o_proj.bias.data.fill_(0.5)
    spec0 = shard_spec(ranks[0].model.layers[0].self_attn.o_proj.bias)
    spec1 = shard_spec(ranks[1].model.layers[0].self_attn.o_proj.bias)
    assert spec0 is None and spec1 is not None and spec1.zero
    assert torch.equal(spec1.narrow(whole.model.layers[0].self_attn.o_proj.bias), torch.zeros(64))


def test_merged_spec_narrows_each_part():
    spec = ShardSpec((Split(0, (Piece(4, 2, 1), Piece(6, 2, 1))),))
    full = torch.arange(10.0)[:, None]
    assert spec.full_shape((5, 1)) == (10, 1)
    assert spec.narrow(full).flatten().tolist() == [2, 3, 7, 8, 9]
    assert spec.narrow_part(torch.arange(6.0)[:, None], 1).flatten().tolist() == [3, 4, 5]


def test_bad_degrees_name_the_dimension():
    with pytest.raises(ValueError, match="num_attention_heads=4"):
        shards(tiny("tiny_llama"), 3)
    with pytest.raises(ValueError, match="tp_size > 1 needs a TPComm"):
        ModelParallel(0, 2, 1, None)
