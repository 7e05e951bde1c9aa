"""Expert parallelism priced as the runtime runs it (EP inside the TP group, as SGLang without DeepEP):
each GPU computes only its own experts' pairs (T * k / ep, experts ep times as wide), reads its
El experts' weights, and the MoE layer's all-reduce over the tp GPUs is the combine -- no all-to-all.
Also under DP attention, where the MoE runs on the gathered tokens."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from runtime.core.layout import ParallelLayout
from sim.costmodel.base import StepShape
from sim.costmodel.collectives import AlphaBetaCollectives
from sim.costmodel.dp_attention import DPAttentionCostModel
from sim.costmodel.roofline_ops import GPU_OPS, moe_experts_s

ROOT = Path(__file__).resolve().parents[2]
AB = AlphaBetaCollectives(315e9, 45e9, 8, 8e-6, 15e-6, 0.5e-6, 15e-6)


def load(group: str, name: str):
    return instantiate(OmegaConf.load(ROOT / "conf" / group / f"{name}.yaml"))


def roofline(**kw):
    return instantiate(OmegaConf.load(ROOT / "conf" / "costmodel" / "roofline.yaml"), collective_table=None)(**kw)


def cost_model(model: str, layout: ParallelLayout):
    return roofline(model=load("model", model), hardware=load("hardware", "h200"), layout=layout)


def decode(bs: int, ctx: int = 2048) -> StepShape:
    return StepShape(num_decode_reqs=bs, decode_context_tokens=bs * ctx)


@pytest.mark.parametrize("model,tp,ep", [("deepseek_v2_lite", 2, 2), ("deepseek_v3", 8, 8), ("deepseek_v3", 8, 2)])
def test_a_gpu_prices_its_own_pairs_and_its_own_experts(model, tp, ep) -> None:
    spec = load("model", model)
    c = cost_model(model, ParallelLayout(tp=tp, ep=ep)).coef
    H, k, E, ab = spec.hidden_size, spec.num_experts_per_tok, spec.num_experts, c.act_dtype_bytes
    width = spec.moe_intermediate_size * ep / tp                # one local expert's intermediate slice
    own_pairs_per_token = k / ep
    assert c.routed_flops_per_token == pytest.approx(own_pairs_per_token * 2 * 3 * H * width)
    assert c.moe_act_bytes_per_token == pytest.approx(own_pairs_per_token * (2 * H + 3 * width) * ab)
    local_experts = E // ep
    assert c.routed_bytes_all_experts == pytest.approx(
        local_experts * 3 * H * width * spec.bytes_per_param("routed_experts"))
    # a single token touches k experts of E: k/ep of this GPU's on average, each read whole
    one = moe_experts_s(c, 1) * c.moe_bytes_per_s
    assert one == pytest.approx(k / ep * 3 * H * width * spec.bytes_per_param("routed_experts")
                                + c.moe_act_bytes_per_token)


def test_ep_keeps_tp_compute_and_its_allreduce_and_has_no_alltoall() -> None:
    """tp=2 ep=2 against tp=2 (DeepSeek-V2-Lite, the layout the runtime serves): about the same MoE time,
    the same all-reduces (after attention and after every MLP/MoE layer), one more kernel per MoE layer."""
    tp, ep = cost_model("deepseek_v2_lite", ParallelLayout(tp=2)), cost_model("deepseek_v2_lite",
                                                                           ParallelLayout(tp=2, ep=2))
    assert "ep_alltoall" not in GPU_OPS
    for shape in (decode(1), decode(64), decode(256), StepShape((4096,), (0,))):
        a, b = tp.breakdown_s(shape), ep.breakdown_s(shape)
        assert "ep_alltoall" not in b
        # the same FLOPs and weight bytes; fewer activation rows (a pair's hidden row in and out: own pairs only)
        assert a["moe_experts"] >= b["moe_experts"] == pytest.approx(a["moe_experts"], rel=0.05)
        assert b["tp_allreduce"] == pytest.approx(a["tp_allreduce"], rel=1e-12) and a["tp_allreduce"] > 0
        assert b["kernel_floor"] > a["kernel_floor"]
        assert ep.step_time_s(shape) == pytest.approx(tp.step_time_s(shape), rel=0.03)
    spec = load("model", "deepseek_v2_lite")
    assert ep.coef.num_kernels - tp.coef.num_kernels == len(spec.moe_layer_ids)
    layers = 2 * spec.num_layers                        # after attention, after each MLP (dense or MoE)
    tokens, message_bytes = 64, 64 * spec.hidden_size * 2
    assert ep.breakdown_s(decode(tokens))["tp_allreduce"] == pytest.approx(
        layers * ep.collectives.time_s("all_reduce", message_bytes, 2, True))


def test_dp_attention_ep_gathers_for_moe_layers_too() -> None:
    """Under DP attention the runtime gathers every rank's tokens before each MLP/MoE layer and
    reduce-scatters after it, EP or not: EP changes only which pairs a GPU computes."""
    model, hardware = load("model", "deepseek_v3"), load("hardware", "h200")

    def dpa(ep: int) -> DPAttentionCostModel:
        return DPAttentionCostModel(roofline, model, hardware, ParallelLayout(tp=8, dp=8, ep=ep, dp_attention=True), AB)

    shapes = [decode(32)] * 8
    plain, ep = dpa(1), dpa(8)
    assert ep.communication_s(shapes) == plain.communication_s(shapes)
    gather = plain.communication_s(shapes)["dp_gather"]
    hidden_bytes = model.hidden_size * 2
    assert gather == pytest.approx(model.num_layers * AB.time_s("all_gather", 8 * 32 * hidden_bytes, 8, True))
    parts = ep.breakdown_s(shapes)
    assert "ep_alltoall" not in parts
    assert parts["moe_experts"] == pytest.approx(plain.breakdown_s(shapes)["moe_experts"], rel=0.05)
