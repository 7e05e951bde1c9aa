"""RooflineCostModel: invariants (monotone, vectorised == scalar, breakdown sums) and magnitudes."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from runtime.core.batch import ForwardMode, ScheduledItem, StepPlan
from runtime.core.layout import ParallelLayout
from runtime.core.request import Request, SamplingParams
from sim.costmodel.base import StepShape
from sim.costmodel.roofline import OPS, RooflineCostModel
from sim.costmodel.roofline_ops import distinct_experts

ROOT = Path(__file__).resolve().parents[2]


def load(group: str, name: str):
    return instantiate(OmegaConf.load(ROOT / "conf" / group / f"{name}.yaml"))


def cost_model(model: str = "deepseek_v2_lite", layout: ParallelLayout | None = None,
               **overrides) -> RooflineCostModel:
    """Built the way the lead's code does: a Hydra partial, then model/hardware/layout."""
    cfg = OmegaConf.load(ROOT / "conf" / "costmodel" / "roofline.yaml")
    partial = instantiate(cfg, **overrides)
    return partial(model=load("model", model), hardware=load("hardware", "h200"),
                   layout=layout or ParallelLayout())


def decode(bs: int, ctx_per_req: int = 1024) -> StepShape:
    return StepShape(num_decode_reqs=bs, decode_context_tokens=bs * ctx_per_req)


def prefill(*new: int, prefix: tuple[int, ...] | None = None) -> StepShape:
    return StepShape(extend_new_tokens=new, extend_prefix_tokens=prefix or (0,) * len(new))


SHAPES = [decode(1), decode(64), decode(300), prefill(8192), prefill(100, 7, prefix=(0, 500)),
          StepShape((512,), (2048,), 32, 32 * 3000), StepShape()]
LAYOUTS = [("deepseek_v2_lite", ParallelLayout()), ("deepseek_v3", ParallelLayout(tp=8)),
           ("deepseek_v3", ParallelLayout(tp=8, ep=8)), ("qwen2_moe", ParallelLayout(tp=2)),
           ("llama3_8b", ParallelLayout(tp=2, pp=2)), ("tiny_mla_moe", ParallelLayout())]


def test_distinct_experts_limits() -> None:
    assert distinct_experts(64, 6, 1) == pytest.approx(6)
    assert distinct_experts(64, 6, 100_000) == pytest.approx(64)
    assert distinct_experts(64, 6, 0) == 0
    counts = [distinct_experts(256, 8, t) for t in (1, 2, 8, 64, 512)]
    assert counts == sorted(counts) and counts[-1] <= 256


@pytest.mark.parametrize("model, layout", LAYOUTS, ids=lambda x: str(x))
def test_breakdown_sums_to_step_time(model: str, layout: ParallelLayout) -> None:
    cm = cost_model(model, layout)
    for shape in SHAPES:
        parts = cm.breakdown_s(shape)
        assert tuple(parts) == OPS and all(v >= 0 for v in parts.values())
        assert sum(parts.values()) == pytest.approx(cm.step_time_s(shape), rel=1e-12)


@pytest.mark.parametrize("model, layout", LAYOUTS, ids=lambda x: str(x))
def test_decode_times_equal_step_time_elementwise(model: str, layout: ParallelLayout) -> None:
    cm = cost_model(model, layout)
    rng = np.random.default_rng(0)
    for bs in (1, 7, 256, 300):                     # 300 > cuda_graph_max_bs: eager launch
        ctx = np.cumsum(np.full(50, bs)) + bs * rng.integers(1, 4000)
        vectorised = cm.decode_times_s(bs, ctx)
        scalar = [cm.step_time_s(StepShape(num_decode_reqs=bs, decode_context_tokens=int(c)))
                  for c in ctx]
        np.testing.assert_array_equal(vectorised, np.array(scalar))


def test_monotone_in_context_batch_and_tokens() -> None:
    for model in ("deepseek_v2_lite", "llama3_8b", "qwen2_moe"):
        cm = cost_model(model)
        ctx_times = cm.decode_times_s(16, np.arange(16, 16 * 8000, 997))
        assert np.all(np.diff(ctx_times) >= 0) and ctx_times[-1] > ctx_times[0]
        bs_times = [cm.step_time_s(decode(bs)) for bs in (1, 2, 8, 64, 256, 257, 512)]
        assert bs_times == sorted(bs_times)
        tokens = [cm.step_time_s(prefill(n)) for n in (1, 16, 256, 2048, 8192, 16384)]
        assert tokens == sorted(tokens) and tokens[-1] > 2 * tokens[-2] * 0.9
        prefixes = [cm.step_time_s(prefill(512, prefix=(p,))) for p in (0, 1, 1024, 32768)]
        assert prefixes == sorted(prefixes)


def test_cuda_graph_cheaper_than_eager_at_bs1() -> None:
    graph = cost_model(cuda_graph=True).breakdown_s(decode(1))
    eager = cost_model(cuda_graph=False).breakdown_s(decode(1))
    assert graph["launch"] < eager["launch"]
    assert sum(graph.values()) < sum(eager.values())


def test_tp_cuts_weight_bound_decode_time() -> None:
    one = cost_model("llama3_8b").step_time_s(decode(1))
    two = cost_model("llama3_8b", ParallelLayout(tp=2)).step_time_s(decode(1))
    assert two < 0.75 * one
    parts = cost_model("llama3_8b", ParallelLayout(tp=2)).breakdown_s(decode(1))
    assert parts["tp_allreduce"] > 0


def test_expert_parallel_keeps_the_moe_allreduce_as_its_combine() -> None:
    tp = cost_model("deepseek_v3", ParallelLayout(tp=8)).breakdown_s(decode(64))
    ep = cost_model("deepseek_v3", ParallelLayout(tp=8, ep=8)).breakdown_s(decode(64))
    assert "ep_alltoall" not in ep
    assert ep["tp_allreduce"] == pytest.approx(tp["tp_allreduce"])
    assert ep["moe_experts"] == pytest.approx(tp["moe_experts"], rel=0.05)


def test_moe_weight_reads_follow_distinct_experts() -> None:
    cm = cost_model()
    bs1, bs64 = cm.breakdown_s(decode(1)), cm.breakdown_s(decode(64))
    # 6 of 64 experts at bs 1, nearly all 64 at bs 64: weight-bound, so about 10x the time.
    assert 8 < bs64["moe_experts"] / bs1["moe_experts"] < 12


def test_deepseek_v2_lite_magnitudes_on_h200() -> None:
    cm = cost_model()
    assert 1.5e-3 < cm.step_time_s(decode(1)) < 6e-3
    assert cm.step_time_s(decode(1)) < cm.step_time_s(decode(64)) < 30e-3
    assert 60e-3 < cm.step_time_s(prefill(8192)) < 300e-3


def test_empty_step_costs_only_scheduler_overhead() -> None:
    cm = cost_model()
    assert cm.step_time_s(StepShape()) == pytest.approx(cm.cpu_overhead_s)


def test_shape_from_plan() -> None:
    def item(rid: str, prefix: int, new: int, is_decode: bool) -> ScheduledItem:
        req = Request(rid, list(range(prefix + new)), SamplingParams(), arrival_s=0.0)
        return ScheduledItem(req, prefix, new, list(range(new)), is_decode, samples=True)

    plan = StepPlan(0, ForwardMode.MIXED, [item("a", 100, 28, False), item("b", 40, 1, True),
                                           item("c", 9, 1, True)])
    shape = StepShape.from_plan(plan)
    assert shape == StepShape((28,), (100,), 2, 41 + 10)
    assert shape.num_tokens == 30 and shape.num_seqs == 3 and not shape.is_decode_only


def test_shape_and_constructor_validation() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        StepShape((1, 2), (0,))
    with pytest.raises(ValueError, match="decode context"):
        StepShape(num_decode_reqs=4, decode_context_tokens=3)
    with pytest.raises(ValueError, match="mfu"):
        cost_model(mfu=1.5)


def test_shared_experts_priced_as_the_runtime_runs_them() -> None:
    """One rank: up to STACKED_SHARED_MAX_TOKENS the shared experts ride in the fused MoE's grouped GEMMs
    (its rates); past it, and under tp, they are a dense MLP (the dense rates). Different rates, so the
    price per token changes at the limit on one rank only."""
    from runtime.core.fusion_limits import STACKED_SHARED_MAX_TOKENS as limit
    slow_moe = dict(moe_mfu=0.05, moe_mbu=0.05)           # make the two rate families far apart
    one = cost_model(**slow_moe)
    two = cost_model(layout=ParallelLayout(tp=2), **slow_moe)
    at, past = one.breakdown_s(decode(limit))["shared_experts"], one.breakdown_s(decode(limit + 1))["shared_experts"]
    assert past < 0.5 * at                                  # leaving the slow grouped GEMMs
    tp_at, tp_past = two.breakdown_s(decode(limit))["shared_experts"], two.breakdown_s(decode(limit + 1))["shared_experts"]
    assert tp_past == pytest.approx(tp_at, rel=0.05)        # dense on both sides under tp
