"""The fast path's layer fusions keep Hugging Face's logits: shared experts stacked after the routed ones
(MoE.fuse_shared_experts, SGLang's shared-experts fusion), on the reference path and on the fused
small-ops path, whose few-token steps route in two launches (SmallOps.route; Triton's CPU interpreter
without CUDA) and whose larger steps run the shared MLP as dense GEMMs over the stacked rows, and MLA input
projections stacked into one GEMM (MLAttention.fuse_input_projections)."""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernels.fused_moe.ref import fused_moe_ref  # noqa: E402
from runtime.engine.fast_path import FusedSmallOps, fuse_shared_experts  # noqa: E402
from runtime.models.loader import build_model  # noqa: E402
from runtime.models.mla import MLAttention  # noqa: E402
from runtime.models.moe import MoE  # noqa: E402
from tests.models.conftest import Pair  # noqa: E402
from tests.models.hf_models import hf_logits, rel_err  # noqa: E402
from tests.models.paged import PagedRunner, Seq  # noqa: E402
from tests.models.test_prefill import TOL, prompt  # noqa: E402

STACKED = {"deepseek_v2": 2, "deepseek_v3": 1, "qwen2_moe": 2}   # shared intermediate / expert intermediate


def fused_copy(pair: Pair):
    model = build_model(None, torch.float32, "cpu", load_format="safetensors", path=pair.path)
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    routed = [tuple(m.experts.w13.shape) for m in layers]
    assert fuse_shared_experts(model, lambda *a: None) == len(layers)
    for layer, (experts, two_inter, hidden) in zip(layers, routed):
        assert layer.num_fused_shared == STACKED[pair.family]
        assert layer.experts.w13.shape == (experts + layer.num_fused_shared, two_inter, hidden)
        assert layer.experts.num_local == experts and layer.shared_experts is None and layer.shared_expert is None
        layer.experts_fn = fused_moe_ref            # the fast path's kernel is CUDA-only: the torch reference
    return model


def decode_logits(model, ids: list[int], steps: int) -> torch.Tensor:
    """Prefill `ids`, then feed ids[-steps:] again one token at a time (decode-sized steps) -> [steps, V]."""
    runner, seq = PagedRunner(model), Seq()
    runner.step([(seq, ids[:-steps])])
    return torch.cat([runner.step([(seq, [tok])]) for tok in ids[-steps:]])


@pytest.fixture()
def moe_pair(pair: Pair) -> Pair:
    if pair.family not in STACKED:
        pytest.skip("no shared experts")
    return pair


def test_stacked_shared_experts_keep_hf_logits(moe_pair: Pair) -> None:
    ids = prompt(16, seed=2)
    ref = hf_logits(moe_pair.hf, ids)                                           # [L, V]
    model = fused_copy(moe_pair)
    assert rel_err(PagedRunner(model).step_all([(Seq(), ids)]), ref) <= TOL
    assert rel_err(decode_logits(model, ids, 3), ref[-3:]) <= TOL


# (ROUTER_KERNEL_MAX_TOKENS, STACKED_SHARED_MAX_TOKENS): the defaults (every step of these prompts routes in
# the kernel with its shared pairs); the 12-token prefill through the router GEMM with appended pairs; the
# prefill through the kernel with the shared MLP as dense GEMMs over the stacked rows (Qwen2-MoE: the kernel's
# gate logit), decode steps stacked
THRESHOLDS = [(512, 64), (2, 64), (512, 4)]


@pytest.mark.parametrize("router_max, stacked_max", THRESHOLDS)
def test_fused_path_with_stacked_experts_keeps_hf_logits(moe_pair: Pair, monkeypatch, router_max: int,
                                                        stacked_max: int) -> None:
    """Fused small ops: steps route through SmallOps.route where the routing is greedy (Qwen2-MoE: gated
    shared pieces, renormalised top-k; the DeepSeek families' grouped routing takes the router GEMM).
    MLA layers also run their input projections as one stacked GEMM (DeepSeek-V3: q_a_proj with kv_a)."""
    import runtime.models.moe as moe_module
    monkeypatch.setattr(moe_module, "ROUTER_KERNEL_MAX_TOKENS", router_max)
    monkeypatch.setattr(moe_module, "STACKED_SHARED_MAX_TOKENS", stacked_max)
    ids = prompt(16, seed=3)
    ref = hf_logits(moe_pair.hf, ids)
    model = fused_copy(moe_pair)
    model.small_ops = FusedSmallOps(model)
    attns = [m for m in model.modules() if isinstance(m, MLAttention)]
    assert all(a.fuse_input_projections() for a in attns) and (len(attns) > 0) == moe_pair.family.startswith("deepseek")
    for a in attns:                                   # the Linears read rows of the stacked weight, not copies
        first = a.q_proj if hasattr(a, "q_proj") else a.q_a_proj
        assert first.weight.data_ptr() == a.input_proj_weight.data_ptr()
        assert a.kv_a_proj_with_mqa.weight.data_ptr() == a.input_proj_weight[first.weight.shape[0]:].data_ptr()
    routed_in_kernel = [m.routes_with_kernel() for m in model.modules() if isinstance(m, MoE)]
    assert all(routed_in_kernel) == (moe_pair.family == "qwen2_moe")
    assert rel_err(decode_logits(model, ids, 4), ref[-4:]) <= TOL


def test_unfusable_shared_experts_are_left_alone(moe_pair: Pair) -> None:
    if moe_pair.family != "qwen2_moe":
        pytest.skip("one family is enough")
    model = build_model(None, torch.float32, "cpu", load_format="safetensors", path=moe_pair.path)
    layer = next(m for m in model.modules() if isinstance(m, MoE))
    layer.shared_expert.down_proj.weight.data = layer.shared_expert.down_proj.weight.data[:, :40]  # 40 % 24 != 0
    before = layer.experts.w13
    assert not layer.can_fuse_shared_experts() and layer.fuse_shared_experts() == 0
    assert layer.experts.w13 is before and layer.shared_expert is not None and layer.num_fused_shared == 0
