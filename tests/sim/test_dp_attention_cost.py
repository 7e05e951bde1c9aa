"""DP-attention step pricing: each rank attends over its own requests only, the MLP runs on
everyone's tokens, and the gathers / reduce-scatters are priced per layout (EP too: its MoE runs
on the gathered tokens, as in the runtime)."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from runtime.core.layout import ParallelLayout
from sim.costmodel.base import StepShape
from sim.costmodel.collectives import AlphaBetaCollectives
from sim.costmodel.dp_attention import DPAttentionCostModel, merge_shapes

ROOT = Path(__file__).resolve().parents[2]
AB = AlphaBetaCollectives(315e9, 45e9, 8, 8e-6, 15e-6, 0.5e-6, 15e-6)


def load(group: str, name: str):
    return instantiate(OmegaConf.load(ROOT / "conf" / group / f"{name}.yaml"))


def roofline(**kw):
    return instantiate(OmegaConf.load(ROOT / "conf" / "costmodel" / "roofline.yaml"))(**kw)


def dpa(tp: int, dp: int, ep: int = 1, model: str = "deepseek_v3") -> DPAttentionCostModel:
    return DPAttentionCostModel(roofline, load("model", model), load("hardware", "h200"),
                                ParallelLayout(tp=tp, dp=dp, ep=ep, dp_attention=True), AB)


def decode(bs: int, ctx: int = 4096) -> StepShape:
    return StepShape(num_decode_reqs=bs, decode_context_tokens=bs * ctx)


def test_merge_shapes_concatenates_ranks() -> None:
    a, b = StepShape((100,), (20,), 3, 30), StepShape((), (), 5, 500)
    m = merge_shapes([a, b, StepShape()])
    assert m.extend_new_tokens == (100,) and m.num_decode_reqs == 8 and m.decode_context_tokens == 530


def test_each_rank_attends_only_its_own_requests() -> None:
    """MLA under plain tp=8 replicates the latent KV: every GPU reads all 256 requests' KV.
    With dp attention each of the 8 ranks reads only its 32 requests'."""
    plain = roofline(model=load("model", "deepseek_v3"), hardware=load("hardware", "h200"),
                     layout=ParallelLayout(tp=8))
    tp_attn = plain.breakdown_s(decode(256))["attn_decode"]
    dp_attn = dpa(8, 8).breakdown_s([decode(32)] * 8)["attn_decode"]
    assert dp_attn < 0.3 * tp_attn
    assert dpa(8, 8).step_time_s([decode(32)] * 8) < plain.step_time_s(decode(256))


def test_slowest_rank_sets_the_attention_time_and_idle_ranks_cost_nothing_alone() -> None:
    cm = dpa(8, 8)
    even = cm.breakdown_s([decode(32)] * 8)
    skewed = cm.breakdown_s([decode(200)] + [decode(8)] * 7)
    assert skewed["attn_decode"] > 4 * even["attn_decode"]
    assert cm.step_time_s([StepShape()] * 8) == 0.0
    one_busy = cm.breakdown_s([decode(32)] + [StepShape()] * 7)
    assert one_busy["attn_decode"] == pytest.approx(even["attn_decode"])
    with pytest.raises(ValueError, match="expected 8 shapes"):
        cm.step_time_s([decode(1)])


def test_communication_is_priced_per_layout() -> None:
    shapes8 = [decode(32)] * 8
    tp_moe = dpa(8, 8).communication_s(shapes8)
    assert tp_moe["dp_gather"] > 0 and tp_moe["mlp_reduce_scatter"] > 0
    assert tp_moe["attn_tp_allreduce"] == 0                      # attention_tp = 1: nothing to reduce
    ep_moe = dpa(8, 8, ep=8).communication_s(shapes8)
    assert ep_moe == tp_moe                                      # every MLP/MoE layer gathers and scatters
    half = dpa(8, 4).communication_s([decode(64)] * 4)
    assert half["attn_tp_allreduce"] > 0                         # attention_tp = 2
    more = dpa(8, 8).communication_s([decode(128)] * 8)
    assert all(more[k] >= tp_moe[k] for k in tp_moe) and more["dp_gather"] > tp_moe["dp_gather"]


def test_cost_grows_with_tokens() -> None:
    cm = dpa(8, 8, ep=8)
    times = [cm.step_time_s([decode(b)] * 8) for b in (1, 8, 64, 256)]
    assert times == sorted(times) and times[0] < times[-1]
    prefills = [cm.step_time_s([StepShape((n,), (0,))] * 8) for n in (128, 1024, 8192)]
    assert prefills == sorted(prefills)


def test_needs_a_dp_attention_layout() -> None:
    with pytest.raises(ValueError, match="dp_attention=True"):
        DPAttentionCostModel(roofline, load("model", "deepseek_v3"), load("hardware", "h200"),
                             ParallelLayout(tp=8, dp=8), AB)
