"""The plug points for fast kernels: ForwardBatch.attn_backend and the MoE experts function."""
from __future__ import annotations

import pytest
import torch

from kernels.fused_moe.ref import fused_moe_ref
from runtime.models.attention_backend import TorchAttentionBackend
from runtime.models.moe import set_experts_fn
from tests.models.conftest import Pair
from tests.models.paged import PagedRunner, Seq
from tests.models.test_prefill import prompt


class CountingBackend(TorchAttentionBackend):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def mha(self, layer, *args, **kwargs):
        self.calls.append(f"mha{layer}")
        return super().mha(layer, *args, **kwargs)

    def mla(self, layer, *args, **kwargs):
        self.calls.append(f"mla{layer}")
        return super().mla(layer, *args, **kwargs)

    def mla_mha(self, layer, *args, **kwargs):
        self.calls.append(f"mla_mha{layer}")
        return super().mla_mha(layer, *args, **kwargs)


def test_attention_backend_comes_from_the_forward_batch(pair: Pair) -> None:
    runner, backend = PagedRunner(pair.ours), CountingBackend()
    fb = runner.batch([(Seq(), prompt(6, seed=11))])
    expected = pair.ours(fb, runner.pool)
    fb.attn_backend = backend
    assert torch.equal(pair.ours(fb, runner.pool), expected)
    kind = "mla_mha" if pair.ours.config.use_mla else "mha"   # an MLA prefill without a prefix: MHA form
    assert backend.calls == [f"{kind}{i}" for i in range(pair.ours.config.num_hidden_layers)]


def test_experts_fn_is_swappable(pair: Pair) -> None:
    if not pair.ours.config.num_experts:
        pytest.skip("dense model")
    calls: list[int] = []

    def counting(hidden, w13, w2, weights, ids):
        calls.append(hidden.shape[0])
        return fused_moe_ref(hidden, w13, w2, weights, ids)

    ids = prompt(6, seed=12)
    expected = PagedRunner(pair.ours).step([(Seq(), ids)])
    try:
        num_layers = set_experts_fn(pair.ours, counting)
        assert torch.equal(PagedRunner(pair.ours).step([(Seq(), ids)]), expected)
    finally:
        set_experts_fn(pair.ours, fused_moe_ref)
    assert num_layers == sum(map(pair.ours.config.is_moe_layer, range(pair.ours.config.num_hidden_layers)))
    assert calls == [6] * num_layers
