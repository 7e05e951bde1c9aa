"""SGLang's choice of MLA attention form per extend step (FlashInfer / FA3 backends)."""
from __future__ import annotations

from runtime.core.mla_form import MHA_ONE_SHOT_MAX_KV_TOKENS, MHA_PREFIX_THRESHOLD_TOKENS, mla_attends_as_mha


def test_no_cached_prefix_anywhere_runs_mha() -> None:
    assert mla_attends_as_mha([0], [8192])
    assert mla_attends_as_mha([0, 0, 0], [5, 1, 700])


def test_a_short_prefix_in_any_item_keeps_the_absorbed_form() -> None:
    assert not mla_attends_as_mha([0, 1], [100, 101])
    assert not mla_attends_as_mha([MHA_PREFIX_THRESHOLD_TOKENS - 1], [MHA_PREFIX_THRESHOLD_TOKENS + 500])


def test_summed_prefix_at_the_threshold_expands_it_in_one_shot() -> None:
    half = MHA_PREFIX_THRESHOLD_TOKENS // 2
    assert mla_attends_as_mha([half, half], [half + 10, half + 10])           # the sum counts, not the max
    assert not mla_attends_as_mha([half, half - 1], [half + 10, half + 9])


def test_beyond_one_shot_capacity_stays_absorbed() -> None:
    prefix = MHA_ONE_SHOT_MAX_KV_TOKENS - 100
    assert mla_attends_as_mha([prefix], [prefix + 100])
    assert not mla_attends_as_mha([prefix], [prefix + 101])
