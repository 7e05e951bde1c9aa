"""A request's prompt is the spec's own sequence (no copy at intake), and the radix cache matches
across tuple and int32-array prompts and list outputs."""
from __future__ import annotations

from array import array

import pytest

from runtime.core.cache.allocator import KVSlotAllocator
from runtime.core.cache.eviction.lru import LRUEviction
from runtime.core.cache.radix_cache import RadixCache
from runtime.core.request import Request, RequestSpec


@pytest.mark.parametrize("kind", [tuple, lambda ids: array("i", ids)])
def test_from_spec_shares_the_prompt_and_tokens_keep_its_type(kind) -> None:
    spec = RequestSpec("r", 0.0, kind(range(10, 20)), output_len=4)
    req = Request.from_spec(spec)
    assert req.input_ids is spec.input_ids            # no copy of a prompt at intake
    assert req.tokens() is spec.input_ids             # nor while it has no output
    req.output_ids += [7, 8]
    assert req.tokens() == kind([*range(10, 20), 7, 8]) and type(req.tokens()) is type(spec.input_ids)
    assert req.fill_ids == [*range(10, 20), 7, 8]     # the list copy


@pytest.mark.parametrize("kind", [tuple, lambda ids: array("i", ids)])
def test_a_prompt_matches_edges_inserted_from_lists_and_back(kind) -> None:
    cache = RadixCache(KVSlotAllocator(64), LRUEviction())
    slots = cache.allocator.allocate_slots(0, 12, None)
    assert cache.insert([1, 2, 3, 4, 5, 6], slots[:6], now=1.0) == 0             # a list edge
    assert cache.insert(kind([1, 2, 3, 4, 5, 6, 7, 8, 9]), slots[:9], now=2.0) == 6   # a prompt continues it
    match = cache.match_prefix(kind([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]))
    assert match.length == 9 and match.slots == slots[:9].tolist()
    match = cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0])                     # list query, prompt edge
    assert match.length == 8
    match = cache.match_prefix(kind([1, 2, 3, 9]))                              # a prompt splits a list edge
    assert match.length == 3 and list(match.node.key) == [1, 2, 3]
