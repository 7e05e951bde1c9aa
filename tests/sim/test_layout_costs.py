"""The roofline prices every layout up to 64 GPUs: per-rank work shrinks with tp, collectives
appear per layout (TP all-reduce, also EP's combine; PP sends, NIC past one node), graph and eager
latencies stay apart, a measured table replaces alpha-beta, and cost grows with tokens."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from runtime.core.layout import ParallelLayout
from sim.costmodel.base import StepShape
from sim.costmodel.collectives import AlphaBetaCollectives

ROOT = Path(__file__).resolve().parents[2]


def load(group: str, name: str):
    return instantiate(OmegaConf.load(ROOT / "conf" / group / f"{name}.yaml"))


def cost_model(model: str, layout: ParallelLayout, **overrides):
    partial = instantiate(OmegaConf.load(ROOT / "conf" / "costmodel" / "roofline.yaml"), **overrides)
    return partial(model=load("model", model), hardware=load("hardware", "h200"), layout=layout)


def decode(bs: int, ctx: int = 2048) -> StepShape:
    return StepShape(num_decode_reqs=bs, decode_context_tokens=bs * ctx)


LAYOUTS = [ParallelLayout(tp=t, ep=e, pp=p) for t, e, p in
           [(8, 1, 1), (8, 8, 1), (16, 16, 1), (32, 32, 2), (64, 64, 1), (64, 8, 1), (8, 1, 8)]]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"tp{l.tp}-ep{l.ep}-pp{l.pp}")
def test_cost_grows_with_tokens_for_every_layout(layout) -> None:
    cm = cost_model("deepseek_v3", layout)
    decodes = [cm.step_time_s(decode(b)) for b in (1, 16, 128, 512)]
    prefills = [cm.step_time_s(StepShape((n,), (0,))) for n in (64, 1024, 8192)]
    assert decodes == sorted(decodes) and prefills == sorted(prefills)
    parts = cm.breakdown_s(decode(128))
    assert parts["tp_allreduce"] > 0 and "ep_alltoall" not in parts
    assert (parts["pp_send"] > 0) == (layout.pp > 1)


def test_per_rank_work_shrinks_with_tp() -> None:
    one, two = cost_model("llama3_8b", ParallelLayout()), cost_model("llama3_8b", ParallelLayout(tp=2))
    a, b = one.breakdown_s(decode(8)), two.breakdown_s(decode(8))
    assert b["attn_proj"] == pytest.approx(a["attn_proj"] / 2, rel=0.05)     # weight-bound: half the bytes
    assert b["dense_mlp"] == pytest.approx(a["dense_mlp"] / 2, rel=0.05)
    assert a["tp_allreduce"] == 0 < b["tp_allreduce"]


def test_collective_cost_per_layout() -> None:
    """Per token, a 16-rank all-reduce leaves the node (NIC bandwidth, inter-node latency)."""
    shape = StepShape((4096,), (0,))
    tp8 = cost_model("deepseek_v3", ParallelLayout(tp=8)).breakdown_s(shape)["tp_allreduce"]
    tp16 = cost_model("deepseek_v3", ParallelLayout(tp=16)).breakdown_s(shape)["tp_allreduce"]
    assert tp16 > 3 * tp8
    ep8 = cost_model("deepseek_v3", ParallelLayout(tp=8, ep=8)).breakdown_s(shape)
    assert ep8["tp_allreduce"] == pytest.approx(tp8)     # EP's combine is the MoE layer's all-reduce


def test_graph_and_eager_collective_latency_apart() -> None:
    layout = ParallelLayout(tp=8)
    # alpha-beta explicitly: a measured table (experiments/results/h200/collectives.csv) would replace it
    graph = cost_model("deepseek_v3", layout, cuda_graph=True, collective_table=None).breakdown_s(decode(4))["tp_allreduce"]
    eager = cost_model("deepseek_v3", layout, cuda_graph=False, collective_table=None).breakdown_s(decode(4))["tp_allreduce"]
    cm = cost_model("deepseek_v3", layout, collective_table=None)
    num = 61 + 3 + 58               # after attention in all 61 layers, 3 dense MLPs, 58 MoE layers (ep=1)
    assert eager - graph == pytest.approx(num * (cm.collectives.eager_latency_s - cm.collectives.graph_latency_s))


def test_measured_table_replaces_alpha_beta(tmp_path) -> None:
    table = tmp_path / "collectives.csv"
    table.write_text("collective,num_ranks,size_bytes,graph,time_s\n"
                     "all_reduce,8,1,1,1e-03\nall_reduce,8,1e9,1,2e-03\n")
    measured = cost_model("deepseek_v3", ParallelLayout(tp=8), collective_table=str(table))
    plain = cost_model("deepseek_v3", ParallelLayout(tp=8), collective_table=None)
    assert isinstance(plain.collectives, AlphaBetaCollectives)
    parts = measured.breakdown_s(decode(4))
    assert parts["tp_allreduce"] == pytest.approx(122 * 1e-3, rel=1e-3)      # ~1 ms each, from the table
    assert plain.breakdown_s(decode(4))["tp_allreduce"] < 0.05 * parts["tp_allreduce"]
