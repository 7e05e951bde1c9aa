"""The working set counts shared prefixes once, page by page, plus every output token."""
from __future__ import annotations

import pytest

from experiments.working_set import working_set_tokens
from runtime.core.request import RequestSpec


def spec(rid: str, input_ids: list[int], output_len: int, expected: list[int] | None = None) -> RequestSpec:
    return RequestSpec(rid=rid, arrival_s=0.0, input_ids=input_ids, output_len=output_len,
                       expected_output_ids=expected)


def test_shared_prefix_counts_once():
    shared = list(range(128))
    specs = [spec("a", shared + [1000] * 64, 5), spec("b", shared + [2000] * 64, 7)]
    assert working_set_tokens(specs, page_tokens=64) == 128 + 64 + 64 + 5 + 7


def test_same_page_after_different_prefixes_is_distinct():
    specs = [spec("a", [1] * 64 + [9] * 64, 1), spec("b", [2] * 64 + [9] * 64, 1)]
    assert working_set_tokens(specs, page_tokens=64) == 4 * 64 + 2


def test_known_outputs_are_part_of_the_next_turn():
    turn1 = spec("t1", list(range(64)), 64, expected=list(range(100, 164)))
    turn2 = spec("t2", list(range(64)) + list(range(100, 164)) + list(range(200, 264)), 3)
    assert working_set_tokens([turn1, turn2], page_tokens=64) == 3 * 64 + 3


def test_page_size_must_be_positive():
    with pytest.raises(ValueError):
        working_set_tokens([], page_tokens=0)
