"""The roofline's twin of the runtime's piecewise CUDA graphs (runtime/engine/piecewise_graph_runner.py):
an extend step that fits the largest captured token count pays graph launches plus the eager attention
cores instead of every kernel's launch, and its non-attention work runs over the padded token count; the
limit follows the runtime's config unless the cost model sets its own."""
from __future__ import annotations

import pytest

from experiments.compose import compose_config
from runtime.core.graph_grids import extend_token_buckets, padded_size
from sim.predictor import runtime_graph_limits
from tests.sim.test_roofline import cost_model, prefill

STATIC_OPS = ("attn_proj", "dense_mlp", "moe_gate", "moe_experts", "shared_experts", "elementwise")


def test_off_by_default_and_zero_means_off() -> None:
    plain, zero = cost_model(), cost_model(piecewise_max_tokens=0)
    for shape in (prefill(300), prefill(4200), prefill(100, 7, prefix=(0, 500))):
        assert plain.step_time_s(shape) == zero.step_time_s(shape)


def test_small_prefills_lose_their_launch_cost() -> None:
    launch = {"kernel_launch_s": 5e-5}                   # the H200 fit's host cost per eager kernel
    eager, piecewise = cost_model(**launch), cost_model(piecewise_max_tokens=8192, **launch)
    small = prefill(64)
    assert piecewise.breakdown_s(small)["launch"] < 0.25 * eager.breakdown_s(small)["launch"]
    assert piecewise.step_time_s(small) < eager.step_time_s(small)
    big = prefill(16384)                                   # past the largest captured step: eager as before
    assert piecewise.step_time_s(big) == eager.step_time_s(big)


def test_decode_only_steps_past_the_graph_limit_stay_eager() -> None:
    from tests.sim.test_roofline import decode

    eager = cost_model(cuda_graph_max_bs=256)
    piecewise = cost_model(cuda_graph_max_bs=256, piecewise_max_tokens=2048)
    assert piecewise.step_time_s(decode(400)) == eager.step_time_s(decode(400))
    assert piecewise.step_time_s(decode(200)) == eager.step_time_s(decode(200))   # the decode graph


def test_static_work_runs_over_the_padded_token_count() -> None:
    piecewise, eager = cost_model(piecewise_max_tokens=8192), cost_model()
    tokens = 4200
    padded = padded_size(tokens, extend_token_buckets(8192))
    assert padded == 4352
    got, padded_eager = piecewise.breakdown_s(prefill(tokens)), eager.breakdown_s(prefill(padded))
    for op in STATIC_OPS:
        assert got[op] == pytest.approx(padded_eager[op], rel=1e-12), op
    real = eager.breakdown_s(prefill(tokens))
    assert got["attn_prefill"] == pytest.approx(real["attn_prefill"], rel=1e-12)   # attention: real tokens
    assert got["moe_experts"] > real["moe_experts"]


@pytest.mark.parametrize("overrides,expected", [
    ([], 8192),                                            # PIECEWISE_DEFAULT_MAX_TOKENS, the default chunk
    (["scheduler.chunked_prefill_size=1024"], 1024),       # capped by the chunk
    (["scheduler.chunked_prefill_size=-1", "scheduler.max_prefill_tokens=512"], 512),
    (["real.piecewise_cuda_graph_max_tokens=512"], 512),
    (["real.piecewise_cuda_graph=false"], 0),
    (["real.cuda_graph=false"], 0),
    (["tp=2"], 8192),                                      # every GPU of the TP group captures them
    (["tp=2", "ep=2"], 8192),
    (["model=deepseek_v2_lite", "tp=2", "dp=2", "dp_attention=true"], 0),   # DP attention: decode graphs only
    (["costmodel=roofline", "costmodel.piecewise_max_tokens=1024"], None),   # the cost model's own
])
def test_limit_follows_the_runtime(overrides: list[str], expected: int | None) -> None:
    cfg = compose_config(["mode=sim", "costmodel=roofline"] + overrides)
    limits = runtime_graph_limits(cfg)
    if expected is None:
        assert "piecewise_max_tokens" not in limits
    else:
        assert limits["piecewise_max_tokens"] == expected


def test_launch_time_is_the_host_side_of_each_launch_kind() -> None:
    """launch_time_s: one graph launch for a replayed decode, the pieces plus the eager attention cores for
    a piecewise extend, every kernel's launch past the limit; and what a launch adds to the step is only
    what its kernels do not cover."""
    from tests.sim.test_roofline import decode

    model = cost_model(kernel_launch_s=5e-5, cuda_graph_max_bs=256, piecewise_max_tokens=2048)
    graph, small, big = decode(64), prefill(64), prefill(4096)
    assert model.launch_time_s(graph) == model.hardware.cuda_graph_launch_s
    assert model.hardware.cuda_graph_launch_s < model.launch_time_s(small) < model.launch_time_s(big)
    for shape, floor in ((small, model.hardware.cuda_graph_launch_s), (big, 5e-5)):
        parts = model.breakdown_s(shape)
        gpu = model.step_time_s(shape) - parts["launch"] - parts["cpu_overhead"]
        assert parts["launch"] == pytest.approx(max(floor, model.launch_time_s(shape) - gpu))


def test_only_a_replayed_decode_graph_waits_for_its_launch() -> None:
    """device_waits_for_launch: decode-only steps within the graph limit (one replay enqueued as the launch
    returns); eager decodes past it, extends and a model without graphs enqueue kernels all along."""
    from tests.sim.test_roofline import decode

    model = cost_model(cuda_graph_max_bs=256, piecewise_max_tokens=2048)
    assert model.device_waits_for_launch(decode(1)) and model.device_waits_for_launch(decode(256))
    assert not model.device_waits_for_launch(decode(257))
    assert not model.device_waits_for_launch(prefill(64)) and not model.device_waits_for_launch(prefill(4096))
    assert not cost_model(cuda_graph=False).device_waits_for_launch(decode(8))
