"""The roofline prices an MLA extend in the form the runtime runs it (runtime.core.mla_form): MHA without
any cached prefix or with a summed prefix at the threshold (then also expanding the prefix latents), else
absorbed."""
from __future__ import annotations

import pytest

from runtime.core.mla_form import MHA_PREFIX_THRESHOLD_TOKENS
from sim.costmodel.roofline_ops import _extend_attention_s, _roof
from tests.sim.test_roofline import cost_model


def _attention_s(c, flops_per_pair: float, act_bytes: float, new: int, prefix: int) -> float:
    pairs = new * (new + 1) / 2 + new * prefix
    return _roof(pairs * flops_per_pair, (new + prefix) * c.kv_bytes_per_token_layer + new * act_bytes,
                 c.attn_flops_per_s, c.attn_bytes_per_s)


def test_mla_prefill_without_prefix_is_priced_as_mha() -> None:
    c = cost_model().coef
    assert c.is_mla and c.absorbed_flops_per_pair > 3 * c.prefill_flops_per_pair   # the form matters
    mha = _attention_s(c, c.prefill_flops_per_pair, c.prefill_act_bytes_per_token, 8192, 0)
    assert _extend_attention_s(c, (8192,), (0,)) == pytest.approx(mha)


def test_short_prefix_is_absorbed_and_long_prefix_is_expanded() -> None:
    c = cost_model().coef
    short = MHA_PREFIX_THRESHOLD_TOKENS - 1
    absorbed = _attention_s(c, c.absorbed_flops_per_pair, c.absorbed_act_bytes_per_token, 512, short)
    assert _extend_attention_s(c, (512,), (short,)) == pytest.approx(absorbed)
    long = 4 * MHA_PREFIX_THRESHOLD_TOKENS
    mha = _attention_s(c, c.prefill_flops_per_pair, c.prefill_act_bytes_per_token, 512, long)
    expand = _roof(2 * long * c.mla_expand_params, long * c.mla_expand_act_bytes_per_token,
                   c.linear_flops_per_s, c.gemm_bytes_per_s)
    assert c.mla_expand_params > 0 and expand > 0
    assert _extend_attention_s(c, (512,), (long,)) == pytest.approx(mha + expand)


def test_gqa_models_have_one_form() -> None:
    c = cost_model("llama3_8b").coef
    with_prefix = _extend_attention_s(c, (512,), (MHA_PREFIX_THRESHOLD_TOKENS - 1,))
    assert with_prefix == pytest.approx(_attention_s(c, c.prefill_flops_per_pair, c.prefill_act_bytes_per_token,
                                                     512, MHA_PREFIX_THRESHOLD_TOKENS - 1))
