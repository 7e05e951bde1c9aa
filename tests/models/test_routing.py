"""Router top-k against Hugging Face's DeepSeek-V2 gate, also in the corner where top_k exceeds the
experts of the kept groups (SGLang's grouped_topk and HF DeepseekV2TopkRouter give those 0 weight)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from runtime.models.moe import select_experts  # noqa: E402


def dense(weights: torch.Tensor, ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """[T, E] routing weights: the same mixture whatever ids carry a zero weight."""
    return torch.zeros(weights.shape[0], num_experts).scatter_add_(1, ids, weights.float())


@pytest.mark.parametrize("top_k", [3, 4, 6])   # kept groups hold 2 x 2 = 4 experts
def test_group_limited_greedy_matches_hf_deepseek_v2(top_k):
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
    cfg = transformers.DeepseekV2Config(hidden_size=16, num_attention_heads=4, n_routed_experts=8, num_experts_per_tok=top_k,
                                        topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                        routed_scaling_factor=1.5)
    torch.manual_seed(0)
    router = DeepseekV2TopkRouter(cfg)
    torch.nn.init.normal_(router.weight)
    x = torch.randn(32, 16)
    _, hf_weights, hf_ids = router(x)
    logits = x @ router.weight.t()
    weights, ids = select_experts(logits, top_k, "softmax", "group_limited_greedy", 4, 2,
                                  routed_scaling_factor=1.5)
    torch.testing.assert_close(dense(weights, ids, 8), dense(hf_weights, hf_ids, 8))
    outside = dense(weights, ids, 8).view(32, 4, 2).sum(-1).gt(0).sum(-1)   # groups with weight
    assert (outside <= 2).all()
