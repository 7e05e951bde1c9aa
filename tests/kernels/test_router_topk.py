"""The one-launch router (kernels/fused_moe/router_topk.py) against runtime.models.moe.select_experts (greedy)
plus append_shared_pairs, on float32 logits of the same rows.

Without CUDA the kernel runs in Triton's CPU interpreter (float32 / float16 inputs); the gpu test runs
bfloat16 at DeepSeek-V2-Lite's router shape.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernels.fused_moe.router_topk import router_topk  # noqa: E402
from runtime.models.moe import append_shared_pairs, select_experts  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"


def reference(x, rows, num_experts, top_k, scoring, renorm, scale, num_shared, gated):
    logits = x.float() @ rows.float().t()                                       # [T, E (+1)]
    weights, ids = select_experts(logits[:, :num_experts], top_k, scoring, "greedy", 1, 1, renorm, scale)
    if num_shared:
        gate = logits[:, num_experts:] if gated else None
        weights, ids = append_shared_pairs(weights, ids, num_experts, num_shared, gate)
    return weights, ids


def as_sets(weights: torch.Tensor, ids: torch.Tensor, top_k: int) -> list[dict[int, float]]:
    """Per token: expert -> weight of the top-k part (the kernel's order among the k may differ)."""
    return [dict(zip(i[:top_k].tolist(), w[:top_k].tolist())) for w, i in zip(weights, ids)]


CASES = [   # tokens, hidden, experts, top-k, scoring, renorm, scale, shared, gated
    (3, 256, 64, 6, "softmax", False, 1.0, 2, False),      # DeepSeek-V2-Lite-like: 2 shared experts, weight 1
    (5, 200, 60, 4, "softmax", False, 1.0, 4, True),       # Qwen2-MoE-like: gated shared pieces, odd hidden
    (4, 128, 16, 2, "sigmoid", True, 2.5, 0, False),       # sigmoid, renormalised, scaled, no shared
    (1, 64, 8, 8, "softmax", True, 1.0, 1, False),         # top-k = every expert
    (2, 96, 60, 4, "softmax", False, 1.0, 0, True),        # gate row read for its logit only (shared apart)
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", CASES, ids=[f"E{c[2]}K{c[3]}S{c[7]}{'g' if c[8] else ''}" for c in CASES])
def test_route_matches_select_experts_and_shared_pairs(case, dtype) -> None:
    tokens, hidden, experts, top_k, scoring, renorm, scale, shared, gated = case
    gen = torch.Generator().manual_seed(tokens * 31 + experts)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype).to(DEVICE)
    rows = (torch.randn(experts + int(gated), hidden, generator=gen) * 0.2).to(dtype).to(DEVICE)
    weights, ids, logits = router_topk(x, rows, experts, top_k, scoring_func=scoring, norm_topk_prob=renorm,
                                       routed_scaling_factor=scale, num_shared=shared, gate_row=gated)
    torch.testing.assert_close(logits.cpu(), (x.float() @ rows.float().t()).cpu(), rtol=1e-5, atol=1e-5)
    want_w, want_ids = reference(x, rows, experts, top_k, scoring, renorm, scale, shared, gated)
    assert weights.shape == ids.shape == (tokens, top_k + shared) and ids.dtype == torch.int32
    got, want = as_sets(weights.cpu(), ids.cpu(), top_k), as_sets(want_w.cpu(), want_ids.cpu(), top_k)
    for token, (g, w) in enumerate(zip(got, want)):
        assert g.keys() == w.keys(), f"token {token}: experts {sorted(g)} != {sorted(w)}"
        for expert in g:
            assert g[expert] == pytest.approx(w[expert], rel=1e-5, abs=1e-6)
    torch.testing.assert_close(ids[:, top_k:].long().cpu(), want_ids[:, top_k:].cpu())
    torch.testing.assert_close(weights[:, top_k:].cpu(), want_w[:, top_k:].cpu(), rtol=1e-5, atol=1e-6)


def test_route_of_no_tokens_and_bad_shapes() -> None:
    rows = torch.randn(8, 32).to(DEVICE)
    weights, ids, logits = router_topk(torch.empty(0, 32).to(DEVICE), rows, 8, 2, num_shared=1)
    assert weights.shape == ids.shape == (0, 3) and logits.shape == (0, 8)
    with pytest.raises(AssertionError):
        router_topk(torch.randn(2, 32).to(DEVICE), rows, 8, 2, gate_row=True, num_shared=1)   # no gate row


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [1, 7, 64])
def test_route_bf16_deepseek_v2_lite_shape(tokens: int) -> None:
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, 2048, generator=gen).bfloat16().cuda()
    rows = (torch.randn(64, 2048, generator=gen) * 0.02).bfloat16().cuda()
    weights, ids, _ = router_topk(x, rows, 64, 6, num_shared=2)
    want_w, want_ids = reference(x, rows, 64, 6, "softmax", False, 1.0, 2, False)
    got, want = as_sets(weights.cpu(), ids.cpu(), 6), as_sets(want_w.cpu(), want_ids.cpu(), 6)
    agree = sum(g.keys() == w.keys() for g, w in zip(got, want))
    assert agree >= tokens - max(1, tokens // 16)          # float32 summation order may swap a near tie
    assert (ids[:, 6:].cpu() == torch.tensor([64, 65], dtype=torch.int32)).all()
