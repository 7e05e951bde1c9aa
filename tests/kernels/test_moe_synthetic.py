"""Synthetic balanced routings used by the MoE tuner and benches: distinct experts per token and an even
load, including expert counts that top-k does not divide (DeepSeek-V2-Lite: 64 experts, top-6)."""
import pytest
import torch

from kernels.fused_moe.synthetic import balanced_topk_ids


@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(1, 64, 6), (37, 64, 6), (512, 60, 4), (100, 8, 2),
                                                          (3, 7, 7)])
def test_balanced_routing_is_distinct_and_even(num_tokens, num_experts, top_k):
    ids = balanced_topk_ids(num_tokens, num_experts, top_k, generator=torch.Generator().manual_seed(1))
    assert ids.shape == (num_tokens, top_k) and ids.dtype == torch.int32
    for row in ids.tolist():
        assert len(set(row)) == top_k
    counts = torch.bincount(ids.reshape(-1).long(), minlength=num_experts)
    assert counts.max() - counts.min() <= 1
    assert int(counts.sum()) == num_tokens * top_k


def test_balanced_routing_refuses_top_k_above_experts():
    with pytest.raises(ValueError, match="K <= E"):
        balanced_topk_ids(4, 4, 5)
