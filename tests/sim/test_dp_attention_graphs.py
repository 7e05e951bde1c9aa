"""CUDA graphs under DP attention, the rule both modes share (runtime.dp_attention_graphs): every rank of
a decode-only step replays the graph of the smallest captured size >= the largest rank's batch (fewer
requests and idle ranks padded to it), any prefill makes every rank eager; mode=real keeps graphs on for
DP attention, and the simulator prices its steps with the runtime's captured sizes and the same rule."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from experiments.compose import compose_config
from runtime.build import build_core, decode_graph_batch_sizes
from runtime.core.graph_grids import capture_batch_sizes
from runtime.core.layout import ParallelLayout
from runtime.dp_attention_graphs import dp_attention_graph_bs
from sim.costmodel.base import StepShape
from sim.costmodel.dp_attention import DPAttentionCostModel, padded_decode_shape
from sim.predictor import dp_attention_cost_model, runtime_graph_limits

ROOT = Path(__file__).resolve().parents[2]
GRID = capture_batch_sizes(64)        # 1 2 4 8 12 16 24 32 40 48 56 64
IDLE = StepShape()


def decode(bs: int, ctx: int = 1000) -> StepShape:
    return StepShape(num_decode_reqs=bs, decode_context_tokens=bs * ctx)


def prefill(n: int) -> StepShape:
    return StepShape((n,), (0,))


# -- the rule ----------------------------------------------------------------------------------
@pytest.mark.parametrize("shapes,expected", [
    ([decode(3), decode(10)], 12),            # the largest rank's batch, up to the next captured size
    ([decode(12), decode(1)], 12),
    ([decode(5), IDLE], 8),                   # an idle rank pads to the others' size
    ([IDLE, IDLE, decode(17), decode(2)], 24),
    ([decode(64), decode(64)], 64),
    ([decode(65), decode(1)], None),          # past the largest captured size: every rank eager
    ([decode(8), prefill(100)], None),        # a prefill anywhere: every rank eager
    ([StepShape((1,), (50,), 7, 7000), IDLE], None),   # mixed step (a chunk beside decodes)
    ([IDLE, IDLE], None),                     # nothing to run
])
def test_every_rank_replays_the_size_of_the_largest_batch(shapes, expected) -> None:
    assert dp_attention_graph_bs(shapes, GRID) == expected


def test_no_captured_sizes_means_eager_and_none_means_any_size() -> None:
    assert dp_attention_graph_bs([decode(3), decode(10)], []) is None
    assert dp_attention_graph_bs([decode(3), decode(10)], None) == 10
    assert dp_attention_graph_bs([decode(3), IDLE], None) == 3


def test_a_rank_whose_kv_overflows_the_graph_buffer_makes_the_step_eager() -> None:
    shapes = [decode(3, ctx=100), decode(10, ctx=100)]          # 300 + 9 padding rows and 1000 + 2 KV tokens
    assert dp_attention_graph_bs(shapes, GRID, max_kv_tokens=1002) == 12
    assert dp_attention_graph_bs(shapes, GRID, max_kv_tokens=1001) is None


# -- the config: mode=real keeps graphs on, the simulator reads the same sizes ----------------
DPA = ["model=deepseek_v2_lite", "hardware=h200", "tp=2", "dp=2", "dp_attention=true"]


def test_mode_real_captures_decode_graphs_under_dp_attention() -> None:
    from runtime.distributed.app import resolved_config

    real = resolved_config(compose_config(["mode=real", "real.cuda_graph_max_bs=512"] + DPA), out_dir="/tmp")["real"]
    assert real["cuda_graph"] and real["cuda_graph_max_bs"] == 512


@pytest.mark.parametrize("overrides,sizes", [
    (["real.cuda_graph_max_bs=512"], capture_batch_sizes(512)),
    ([], capture_batch_sizes(1024)),               # null: the scheduler's max_running_requests (1024)
    (["real.cuda_graph=false"], []),
    (["real.fast_path=false"], []),
])
def test_the_simulator_prices_the_sizes_the_runtime_captures(overrides, sizes) -> None:
    cfg = compose_config(["mode=sim"] + DPA + overrides)
    assert decode_graph_batch_sizes(cfg) == sizes
    if "real.cuda_graph_max_bs=512" in overrides:
        assert runtime_graph_limits(cfg)["cuda_graph_max_bs"] == 512
    cost_model = dp_attention_cost_model(cfg, build_core(cfg))
    assert cost_model.graph_batch_sizes == sizes
    expected = 104 if sizes else None
    assert cost_model.graph_bs([decode(100), decode(3)]) == expected


def test_a_cost_model_with_its_own_graph_limit_keeps_it() -> None:
    cfg = compose_config(["mode=sim", "costmodel=roofline", "costmodel.cuda_graph_max_bs=16",
                          "real.cuda_graph_max_bs=512"] + DPA)
    cost_model = dp_attention_cost_model(cfg, build_core(cfg))
    assert cost_model.graph_batch_sizes == capture_batch_sizes(16)
    assert cost_model.graph_bs([decode(17), IDLE]) is None and cost_model.graph_bs([decode(9), IDLE]) == 12


# -- pricing ----------------------------------------------------------------------------------
def load(group: str, name: str):
    return instantiate(OmegaConf.load(ROOT / "conf" / group / f"{name}.yaml"))


def roofline(**kw):
    return instantiate(OmegaConf.load(ROOT / "conf" / "costmodel" / "roofline.yaml"))(**kw)


def dpa(cuda_graph: bool = True, sizes=tuple(capture_batch_sizes(128))) -> DPAttentionCostModel:
    def make(**kw):
        return roofline(**{"cuda_graph": cuda_graph, **kw})
    return DPAttentionCostModel(make, load("model", "deepseek_v2_lite"), load("hardware", "h200"),
                                ParallelLayout(tp=2, dp=2, dp_attention=True), graph_batch_sizes=sizes)


def test_a_replayed_step_is_priced_at_the_padded_size_on_every_rank() -> None:
    cm = dpa()
    shapes = [decode(100, 1000), decode(3, 1000)]
    assert cm.graph_bs(shapes) == 104
    padded = [padded_decode_shape(s, 104) for s in shapes]
    assert padded[1] == StepShape(num_decode_reqs=104, decode_context_tokens=3000 + 101)
    got = cm.breakdown_s(shapes)
    # the MLP runs over 2 x 104 rows whatever the split; attention is the slowest padded rank's
    assert got == cm.breakdown_s([decode(100, 1000), StepShape(num_decode_reqs=104, decode_context_tokens=3101)])
    even = cm.breakdown_s([decode(104, 1000), decode(104, 1000)])
    for op in ("moe_experts", "moe_gate", "dense_mlp", "lm_head", "dp_gather", "mlp_reduce_scatter"):
        assert got[op] == pytest.approx(even[op])
    assert got["attn_decode"] < even["attn_decode"]


def test_an_idle_rank_replays_padding_rows_with_the_others() -> None:
    cm = dpa()
    one_busy = cm.breakdown_s([decode(20), IDLE])            # bucket 24: the idle rank runs 24 padding rows
    both = cm.breakdown_s([decode(20), decode(24, 1)])
    assert one_busy == pytest.approx(both)
    assert one_busy["launch_and_cpu"] < 1e-3                 # one graph launch, not every kernel's


def test_graphs_make_decode_cheaper_and_a_prefill_makes_every_rank_eager() -> None:
    graphs, eager = dpa(), dpa(cuda_graph=False)
    assert eager.graph_batch_sizes == [] and eager.graph_bs([decode(8), decode(8)]) is None
    decode_only = [decode(8), decode(8)]
    assert graphs.step_time_s(decode_only) < eager.step_time_s(decode_only)
    assert graphs.breakdown_s(decode_only)["kernel_floor"] < eager.breakdown_s(decode_only)["kernel_floor"]
    mixed = [decode(8), prefill(512)]                         # the decode rank runs eagerly too
    assert graphs.step_time_s(mixed) == eager.step_time_s(mixed)
    too_big = [decode(129), decode(8)]                        # past the largest captured size
    assert graphs.step_time_s(too_big) == eager.step_time_s(too_big)
    assert graphs.step_time_s([IDLE, IDLE]) == 0.0
