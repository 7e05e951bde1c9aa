"""Property tests: random request lifecycles against allocator + radix cache, invariants after every op.

Model of a request as the scheduler sees it: it matches and locks a prefix, allocates private slots
for the rest, may grow (decode), may cache a prefix mid-flight (chunked prefill), then finishes
(insert, free duplicates and the unaligned tail, unlock) or aborts (free private, unlock).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from runtime.core.cache.allocator import KVSlotAllocator
from runtime.core.cache.eviction.base import EvictionPolicy
from runtime.core.cache.eviction.fifo import FIFOEviction
from runtime.core.cache.eviction.filo import FILOEviction
from runtime.core.cache.eviction.lfu import LFUEviction
from runtime.core.cache.eviction.lru import LRUEviction
from runtime.core.cache.eviction.mru import MRUEviction
from runtime.core.cache.eviction.priority import PriorityEviction
from runtime.core.cache.eviction.slru import SLRUEviction
from runtime.core.cache.radix_cache import MatchResult, RadixCache
from runtime.core.cache.tree_node import TreeNode
from tests.core.cache.tree_checks import check_tree, path_tokens_and_slots, reference_match

POLICIES: dict[str, Callable[[], EvictionPolicy]] = {
    "lru": LRUEviction, "mru": MRUEviction, "fifo": FIFOEviction, "filo": FILOEviction,
    "lfu": LFUEviction, "slru": SLRUEviction, "priority": PriorityEviction,
}
CAPACITY_SLOTS = {1: 120, 4: 144}
MAX_RUNNING = 4

# 3-token blocks over a 3-letter alphabet: many shared prefixes, mismatches inside pages of 4
BLOCKS = ([0, 0, 1], [0, 1, 1], [1, 0, 0], [2, 2, 2])
token_lists = st.builds(
    lambda blocks, tail: [t for b in blocks for t in BLOCKS[b]] + tail,
    st.lists(st.integers(0, len(BLOCKS) - 1), min_size=0, max_size=7),
    st.lists(st.integers(0, 2), min_size=0, max_size=4),
).filter(len)


@dataclass
class Running:
    tokens: list[int]
    slots: list[int]          # slots[:locked_len] belong to the tree, the rest are private
    locked_len: int
    node: TreeNode


class CacheMachine(RuleBasedStateMachine):
    page_size = 1
    policy_name = "lru"

    def __init__(self) -> None:
        super().__init__()
        self.allocator = KVSlotAllocator(CAPACITY_SLOTS[self.page_size] + self.page_size - 1, self.page_size)
        self.cache = RadixCache(self.allocator, POLICIES[self.policy_name](), self.page_size)
        self.running: list[Running] = []
        self.finished: list[list[int]] = []  # token histories, for follow-up turns
        self.stored_slot: dict[tuple[tuple[int, ...], int], int] = {}  # see _slot_key; as inserted
        self.now_s = 0.0

    # -- helpers ----------------------------------------------------------------------------
    def _tick(self) -> float:
        self.now_s += 1.0
        return self.now_s

    def _aligned(self, n: int) -> int:
        return n - n % self.page_size

    def _allocate(self, start_pos: int, num_tokens: int, last_slot: int | None) -> list[int] | None:
        """Allocate like a scheduler: evict if short, give up if still short."""
        a = self.allocator
        if not a.can_allocate(start_pos, num_tokens):
            short_slots = a.num_pages_needed(start_pos, num_tokens) * a.page_size - a.num_free_slots
            evicted = self.cache.evict(short_slots, self.now_s)
            assert evicted >= short_slots or self.cache.evictable_size() == 0
        if not a.can_allocate(start_pos, num_tokens):
            free_before = a.num_free_slots
            with pytest.raises(MemoryError):
                a.allocate(start_pos, num_tokens, last_slot)
            assert a.num_free_slots == free_before
            return None
        return a.allocate(start_pos, num_tokens, last_slot)

    def _insert(self, req: Running, num_tokens: int) -> int:
        """Insert req's first num_tokens, record what the tree stored, free the duplicates."""
        tokens, slots = req.tokens[:num_tokens], req.slots[:num_tokens]
        already = self.cache.insert(tokens, slots, self._tick(), priority=0)
        aligned = self._aligned(num_tokens)
        assert already % self.page_size == 0 and req.locked_len <= already <= aligned
        for i in range(already, aligned):
            self.stored_slot[self._slot_key(tokens, i)] = slots[i]
        self.allocator.free(req.slots[req.locked_len:already])
        return already

    def _check_match(self, tokens: list[int], match: MatchResult, expected: tuple[int, list[int]]) -> None:
        assert (match.length, match.slots) == expected
        assert match.length % self.page_size == 0
        assert [self.stored_slot[self._slot_key(tokens, i)] for i in range(match.length)] == match.slots
        node_tokens, node_slots = path_tokens_and_slots(match.node)
        assert node_tokens == tokens[:match.length] and node_slots == match.slots

    def _slot_key(self, tokens: list[int], position: int) -> tuple[tuple[int, ...], int]:
        """A cached slot is identified by the tokens up to the end of its page and its position."""
        page_end = position + self.page_size - position % self.page_size
        return tuple(tokens[:page_end]), position

    def _pick(self, index: int) -> Running:
        return self.running[index % len(self.running)]

    # -- rules ------------------------------------------------------------------------------
    @precondition(lambda self: len(self.running) < MAX_RUNNING)
    @rule(tokens=token_lists, priority=st.integers(0, 3))
    def admit(self, tokens: list[int], priority: int) -> None:
        expected = reference_match(self.cache, tokens)
        match = self.cache.match_prefix(tokens)
        self._check_match(tokens, match, expected)
        self.cache.lock(match.node, self._tick(), priority)
        private = self._allocate(match.length, len(tokens) - match.length, None)
        if private is None:
            self.cache.unlock(match.node, self.now_s)
            return
        self.running.append(Running(tokens, match.slots + private, match.length, match.node))

    @precondition(lambda self: len(self.running) < MAX_RUNNING and self.finished)
    @rule(index=st.integers(0, 99), new_tokens=token_lists, priority=st.integers(0, 3))
    def admit_follow_up(self, index: int, new_tokens: list[int], priority: int) -> None:
        """The next turn of a finished conversation: its whole history plus new tokens."""
        self.admit(self.finished[index % len(self.finished)] + new_tokens, priority)

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 99), new_tokens=st.lists(st.integers(0, 2), min_size=1, max_size=5))
    def decode(self, index: int, new_tokens: list[int]) -> None:
        req = self._pick(index)
        slots = self._allocate(len(req.tokens), len(new_tokens), req.slots[-1])
        if slots is not None:
            req.tokens += new_tokens
            req.slots += slots

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 99), fraction=st.floats(0.0, 1.0))
    def cache_unfinished(self, index: int, fraction: float) -> None:
        req = self._pick(index)
        num_tokens = req.locked_len + int(fraction * (len(req.tokens) - req.locked_len))
        self._insert(req, num_tokens)
        match = self.cache.match_prefix(req.tokens[:num_tokens])
        assert match.length == self._aligned(num_tokens)
        assert match.slots[:req.locked_len] == req.slots[:req.locked_len]
        self.cache.lock(match.node, self.now_s)
        self.cache.unlock(req.node, self.now_s)
        req.slots[:match.length] = match.slots
        req.locked_len, req.node = match.length, match.node

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 99))
    def finish(self, index: int) -> None:
        req = self._pick(index)
        self._insert(req, len(req.tokens))
        self.allocator.free(req.slots[self._aligned(len(req.tokens)):])
        self.cache.unlock(req.node, self.now_s)
        self.running.remove(req)
        self.finished.append(req.tokens)

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 99))
    def abort(self, index: int) -> None:
        req = self._pick(index)
        self.allocator.free(req.slots[req.locked_len:])
        self.cache.unlock(req.node, self._tick())
        self.running.remove(req)

    @precondition(lambda self: self.cache.total_size() > 0)
    @rule(num_tokens=st.integers(0, 12), one_leaf_at_a_time=st.booleans())
    def evict(self, num_tokens: int, one_leaf_at_a_time: bool) -> None:
        if not one_leaf_at_a_time:
            evicted = self.cache.evict(num_tokens, self._tick())
            assert evicted >= num_tokens or self.cache.evictable_size() == 0
            return
        evicted = 0
        while evicted < num_tokens:  # evict(k) == evict(1) repeated: check each victim is the policy's minimum
            candidates = [n for n in self.cache.iter_nodes() if n.is_eviction_candidate()]
            if not candidates:
                assert self.cache.evict(1, self.now_s) == 0 and self.cache.evictable_size() == 0
                return
            expected = min(candidates, key=self.cache.eviction.priority_key)
            assert self.cache.evict(1, self.now_s) == len(expected.key)
            assert expected.evicted
            evicted += len(expected.key)

    @rule(tokens=token_lists, max_tokens=st.none() | st.integers(0, 30))
    def match(self, tokens: list[int], max_tokens: int | None) -> None:
        capped = tokens[:max_tokens]
        expected = reference_match(self.cache, capped)
        self._check_match(capped, self.cache.match_prefix(tokens, max_tokens=max_tokens), expected)

    # -- invariants -------------------------------------------------------------------------
    @invariant()
    def slots_are_conserved(self) -> None:
        ps = self.page_size
        private_slots = sum(-(-(len(r.slots) - r.locked_len) // ps) * ps for r in self.running)
        total = self.allocator.num_free_slots + private_slots + self.cache.total_size()
        assert total == self.allocator.capacity_slots
        owned = [s for r in self.running for s in r.slots[r.locked_len:]]
        owned += [s for n in self.cache.iter_nodes() for s in n.slots]
        assert len(set(owned)) == len(owned), "a slot is owned twice"
        assert all(self.allocator.is_allocated(s) for s in owned)

    @invariant()
    def tree_is_consistent(self) -> None:
        check_tree(self.cache)
        for node in self.cache.iter_nodes():
            tokens, slots = path_tokens_and_slots(node)
            assert slots == [self.stored_slot[self._slot_key(tokens, i)] for i in range(len(tokens))]

    @invariant()
    def locked_prefixes_survive(self) -> None:
        expected_locks: dict[int, int] = {}
        for req in self.running:
            assert not req.node.evicted
            tokens, slots = path_tokens_and_slots(req.node)
            assert (tokens, slots) == (req.tokens[:req.locked_len], req.slots[:req.locked_len])
            node = req.node
            while node.parent is not None:
                expected_locks[node.node_id] = expected_locks.get(node.node_id, 0) + 1
                node = node.parent
        for node in self.cache.iter_nodes():
            assert node.lock_ref == expected_locks.get(node.node_id, 0)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("policy_name", sorted(POLICIES))
def test_random_request_lifecycles(page_size: int, policy_name: str) -> None:
    machine = type(f"Machine_{policy_name}_{page_size}", (CacheMachine,),
                   {"page_size": page_size, "policy_name": policy_name})
    run_state_machine_as_test(machine, settings=settings(
        max_examples=15, stateful_step_count=100, deadline=None, database=None,
        phases=[p for p in Phase if p is not Phase.explain],  # its line tracing makes failures crawl
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    ))
