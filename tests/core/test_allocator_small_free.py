"""Small frees are checked against the free pages whose byte has not been written yet (the lazily
settled part of the free stack) without settling them first."""
import numpy as np
import pytest

from runtime.core.cache.allocator import KVSlotAllocator
from runtime.core.cache.radix_cache import MatchResult, RadixCache
from runtime.core.cache.eviction.lru import LRUEviction


def test_small_free_catches_unsettled_free_pages():
    a = KVSlotAllocator(1000, 1)
    s = a.allocate_slots(0, 200, None)
    a.free(s)                                   # a large free: its pages' bytes are written lazily
    t = a.allocate_slots(0, 100, None)          # takes 100 of them back, 100 stay free unsettled
    assert t.tolist() == s[:100].tolist()
    with pytest.raises(ValueError, match="double free"):
        a.free([int(s[150])])                   # free, its byte still unwritten
    a.free([int(t[0])])
    with pytest.raises(ValueError, match="double free"):
        a.free([int(t[0])])                     # pushed unsettled by the small free just before
    with pytest.raises(ValueError, match="double free"):
        a.free([int(t[1]), int(t[1])])          # named twice in one call
    assert a.num_free_slots == 1000 - 100 + 1
    assert not a.is_allocated(int(t[0])) and a.is_allocated(int(t[1]))
    assert a.allocate_slots(0, 2, None).tolist() == [int(t[0]), int(s[100])]   # LIFO order kept


def test_write_slots_equals_slot_array():
    a = KVSlotAllocator(100, 1)
    cache = RadixCache(a, LRUEviction())
    slots = a.allocate_slots(0, 12, None)
    cache.insert(list(range(12)), slots, now=0.0)
    cache.insert(list(range(6)) + [50, 51], np.concatenate((slots[:6], a.allocate_slots(0, 2, None))), now=1.0)
    m = cache.match_prefix(list(range(12)), now=2.0)
    out = np.full(20, -1, dtype=np.int32)
    m.write_slots(out)
    assert out[:m.length].tolist() == slots[:m.length].tolist() and (out[m.length:] == -1).all()
    m2 = MatchResult(m.length, m.node)
    assert m2.slot_array.tolist() == out[:m.length].tolist()
