"""KVManager.match: a waiting request's match goes on from its last one and still sees every
change of the tree (longer prefixes inserted, its path evicted, nodes split)."""
from __future__ import annotations

import random

from runtime.core.cache.allocator import KVSlotAllocator
from runtime.core.cache.eviction.lru import LRUEviction
from runtime.core.cache.radix_cache import RadixCache
from runtime.core.kv_manager import KVManager
from runtime.core.request import Request
from tests.core.harness import spec


def make(capacity: int = 4096, page_size: int = 1) -> KVManager:
    alloc = KVSlotAllocator(capacity, page_size)
    return KVManager(alloc, RadixCache(alloc, LRUEviction(), page_size))


def insert(kv: KVManager, tokens: list[int], now: float = 0.0) -> None:
    slots = kv.allocator.allocate(0, len(tokens), None)
    kv.allocator.free(slots[:kv.cache.insert(tokens, slots, now)])


def test_match_goes_on_from_the_last_one_and_sees_tree_changes():
    kv = make()
    tokens = list(range(100))
    req = Request.from_spec(spec("r", tokens, 4))
    assert kv.match(req).length == 0
    insert(kv, tokens[:40])
    assert kv.match(req).length == 40
    insert(kv, tokens[:80])                       # extends the path below the remembered node
    first = kv.match(req)
    assert first.length == 80 and first.slots == kv.cache.match_prefix(tokens[:80]).slots
    insert(kv, tokens[:20] + [999] * 10)          # splits the remembered path at 20
    assert kv.match(req).length == 80
    kv.cache.evict(1000, now=1.0)                 # the whole path goes
    assert kv.match(req).length == 0
    insert(kv, tokens[:60])
    assert kv.match(req).length == 60


def test_remembered_matches_equal_fresh_ones_under_random_changes():
    rng = random.Random(0)
    for page_size in (1, 4):
        kv = make(capacity=3000, page_size=page_size)
        prefixes = [[rng.randrange(50) for _ in range(60)] for _ in range(3)]
        reqs = [Request.from_spec(spec(f"r{i}", rng.choice(prefixes)[:rng.randint(10, 60)] + [rng.randrange(50)], 2))
                for i in range(20)]
        for step in range(300):
            roll = rng.random()
            if roll < 0.4:
                base = rng.choice(prefixes)
                if kv.allocator.num_free_slots < 200:
                    kv.cache.evict(200, now=float(step))
                insert(kv, base[:rng.randint(1, 60)] + [rng.randrange(50) for _ in range(rng.randint(0, 20))], float(step))
            elif roll < 0.5:
                kv.cache.evict(rng.randint(1, 100), now=float(step))
            req = rng.choice(reqs)
            tokens = req.tokens()
            fresh = kv.cache.match_prefix(tokens, max_tokens=len(tokens) - 1)
            remembered = kv.match(req, now=float(step))
            assert (remembered.length, remembered.node, remembered.slots) == (fresh.length, fresh.node, fresh.slots)
