"""DP attention on the model side (CPU, gloo): tp=4 dp=2 (two attention ranks of two GPUs each) gives
each attention rank the logits one whole model gives its own batch (fp32, <= 1e-5 relative), through
prefills, decodes, an extend over a cached prefix and steps in which one rank is idle (its idle step
still serves the other's MLP); the exchange refuses a step whose token counts disagree, and mode=real
refuses DP attention for a model without MLA."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

torch = pytest.importorskip("torch")

from experiments.compose import compose_config  # noqa: E402
from runtime.distributed.dp_attention import PaddedTokenExchange, dp_attention_parallel  # noqa: E402
from runtime.distributed.spawn import run_on_ranks  # noqa: E402
from runtime.engine.forward_batch import ForwardBatch  # noqa: E402
from runtime.engine.kv_pool import create_kv_pool  # noqa: E402
from runtime.engine.model_runner import rank_config  # noqa: E402
from runtime.models.loader import build_model  # noqa: E402

RTOL = 1e-5


def step_batches(vocab: int) -> list[list]:
    """Per step, each attention rank's batch [(new ids, prefix length, slots)], or None (idle). Each
    rank has its own KV pool, so both use slots from 0."""
    gen = torch.Generator().manual_seed(3)

    def ids(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=gen).tolist()

    return [
        [[(ids(9), 0, list(range(9))), (ids(6), 0, list(range(100, 106)))], [(ids(5), 0, list(range(5)))]],
        [[(ids(1), 9, list(range(10))), (ids(1), 6, list(range(100, 107)))], None],
        [None, [(ids(1), 5, list(range(6)))]],
        [[(ids(1), 10, list(range(11)))], [(ids(3), 4, list(range(4)) + list(range(50, 53)))]],
    ]


def _tokens(batch) -> int:
    return sum(len(new) for new, _, _ in batch) if batch else 0


def dp_attention_logits(info, groups, hf_config: dict, steps: list) -> list:
    parallel, exchange = dp_attention_parallel(info, groups)
    model = build_model(hf_config, torch.float32, "cpu", seed=0, parallel=parallel)
    pool = create_kv_pool(rank_config(model.config, model), 256, torch.float32, "cpu")
    out = []
    for batches in steps:
        exchange.set_step_tokens([_tokens(b) for b in batches])
        mine = batches[info.replica]
        if mine is None:
            model.idle_step()
        else:
            out.append(model(ForwardBatch.build(mine, "cpu"), pool))
    return out


def test_attention_ranks_get_the_logits_of_the_whole_model():
    hf_config = OmegaConf.to_container(compose_config(["model=tiny_mla_moe"]).model.hf_config, resolve=True)
    steps = step_batches(hf_config["vocab_size"])
    results = run_on_ranks(dp_attention_logits, 4, hf_config, steps, dp_attention=2)
    whole = build_model(hf_config, torch.float32, "cpu", seed=0)
    for replica in range(2):
        pool = create_kv_pool(rank_config(whole.config, whole), 256, torch.float32, "cpu")
        reference = [whole(ForwardBatch.build(b[replica], "cpu"), pool) for b in steps if b[replica] is not None]
        assert len(reference) == 3
        for rank in (2 * replica, 2 * replica + 1):       # both GPUs of the attention rank
            got = results[rank]
            assert len(got) == len(reference)
            for mine, ref in zip(got, reference):
                mine = torch.as_tensor(mine)
                assert mine.shape == ref.shape
                assert ((mine - ref).abs().max() / ref.abs().max()).item() <= RTOL


class _OneRank:
    size = 2

    def all_gather_rows(self, x):
        raise AssertionError("must not be reached")

    reduce_scatter_rows = all_gather_rows


def test_a_step_whose_counts_disagree_is_refused():
    exchange = PaddedTokenExchange(_OneRank(), None, attention_rank=0, num_attention_ranks=2)
    exchange.set_step_tokens([3, 5])
    with pytest.raises(RuntimeError, match="runs 4 tokens but the step agreed on 3"):
        exchange.gather(torch.zeros(4, 8))
    assert exchange.padded_rows(3) == 5
    with pytest.raises(ValueError, match="3 token counts for 2 attention ranks"):
        exchange.set_step_tokens([1, 2, 3])


def test_mode_real_refuses_dp_attention_for_a_gqa_model():
    from runtime.build import build_core
    from runtime.distributed.app import check_layout

    cfg = compose_config(["mode=real", "model=tiny_llama", "hardware=cpu", "tp=2", "dp=2", "dp_attention=true",
                          "kv.capacity_tokens=1000"])
    with pytest.raises(ValueError, match="dp_attention in mode=real needs an MLA model"):
        check_layout(build_core(cfg), nnodes=1)
