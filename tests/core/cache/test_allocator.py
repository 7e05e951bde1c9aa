"""KVSlotAllocator: paging arithmetic, page continuation, all-or-nothing failures, double frees."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.core.cache.allocator import KVSlotAllocator


def test_capacity_rounds_down_to_whole_pages() -> None:
    allocator = KVSlotAllocator(num_slots=10, page_size=4)
    assert (allocator.capacity_slots, allocator.num_free_slots, allocator.num_pages) == (8, 8, 2)


@pytest.mark.parametrize("num_slots, page_size", [(0, 1), (3, 4), (8, 0), (8, -1)])
def test_bad_arguments_raise(num_slots: int, page_size: int) -> None:
    with pytest.raises(ValueError):
        KVSlotAllocator(num_slots, page_size)


def test_page_size_one_hands_out_ascending_slots_then_reuses_freed_first() -> None:
    allocator = KVSlotAllocator(8)
    assert allocator.allocate(0, 3, None) == [0, 1, 2]
    assert allocator.allocate(3, 2, 2) == [3, 4]
    allocator.free([1, 2])
    assert allocator.allocate(0, 3, None) == [1, 2, 5]
    assert allocator.num_free_slots == 2


@pytest.mark.parametrize("start_pos, num_tokens, expected", [
    (0, 0, 0), (0, 1, 1), (0, 4, 1), (0, 5, 2), (3, 1, 0), (3, 2, 1), (4, 4, 1), (2, 11, 3), (5, 0, 0),
])
def test_num_pages_needed_counts_page_starts(start_pos: int, num_tokens: int, expected: int) -> None:
    allocator = KVSlotAllocator(64, page_size=4)
    assert allocator.num_pages_needed(start_pos, num_tokens) == expected
    brute_force = sum(1 for p in range(start_pos, start_pos + num_tokens) if p % 4 == 0)
    assert brute_force == expected


def test_paged_allocation_continues_the_last_page() -> None:
    allocator = KVSlotAllocator(16, page_size=4)
    first = allocator.allocate(0, 6, None)          # positions 0..5: page 0 and half of page 1
    assert first == [0, 1, 2, 3, 4, 5]
    assert allocator.num_free_slots == 8
    more = allocator.allocate(6, 3, last_slot=5)    # positions 6, 7 fill page 1; 8 opens page 2
    assert more == [6, 7, 8]
    assert allocator.num_free_slots == 4
    assert allocator.allocate(9, 2, last_slot=8) == [9, 10]   # no new page
    assert allocator.num_free_slots == 4


def test_continuation_requires_a_consistent_last_slot() -> None:
    allocator = KVSlotAllocator(16, page_size=4)
    allocator.allocate(0, 2, None)
    with pytest.raises(ValueError):
        allocator.allocate(2, 1, None)               # missing
    with pytest.raises(ValueError):
        allocator.allocate(2, 1, last_slot=0)        # wrong page offset
    with pytest.raises(ValueError):
        allocator.allocate(2, 1, last_slot=9)        # offset fits but the page is free
    assert allocator.num_free_slots == 12


@pytest.mark.parametrize("page_size", [1, 4])
def test_out_of_memory_leaves_state_unchanged(page_size: int) -> None:
    allocator = KVSlotAllocator(8, page_size=page_size)
    held = allocator.allocate(0, 5, None)
    free_before = allocator.num_free_slots
    assert not allocator.can_allocate(5, 8)
    with pytest.raises(MemoryError, match="out of memory"):
        allocator.allocate(5, 8, held[-1])
    assert allocator.num_free_slots == free_before
    allocator.free(held)
    assert allocator.num_free_slots == allocator.capacity_slots


@pytest.mark.parametrize("page_size", [1, 4])
def test_double_free_raises_and_frees_nothing(page_size: int) -> None:
    allocator = KVSlotAllocator(16, page_size=page_size)
    slots = allocator.allocate(0, 8, None)
    allocator.free(slots[:4])
    free_before = allocator.num_free_slots
    with pytest.raises(ValueError, match="double free"):
        allocator.free(slots[4:] + slots[:1])        # the last one is already free
    assert allocator.num_free_slots == free_before
    assert all(allocator.is_allocated(s) for s in slots[4:])


def test_duplicate_slot_in_one_call_is_a_double_free_for_page_size_one() -> None:
    allocator = KVSlotAllocator(4)
    slots = allocator.allocate(0, 2, None)
    with pytest.raises(ValueError):
        allocator.free([slots[0], slots[1], slots[0]])
    assert allocator.num_free_slots == 2


def test_free_of_part_of_a_page_frees_the_whole_page() -> None:
    allocator = KVSlotAllocator(16, page_size=4)
    slots = allocator.allocate(0, 7, None)           # pages 0 and 1 (slot 7 unused)
    allocator.free(slots[4:])                        # a sequence's tail: positions 4..6
    assert allocator.num_free_slots == 12
    assert not allocator.is_allocated(7)


@pytest.mark.parametrize("bad_slot", [-1, 8, 100])
def test_out_of_range_free_raises(bad_slot: int) -> None:
    allocator = KVSlotAllocator(10, page_size=4)     # capacity 8
    allocator.allocate(0, 8, None)
    with pytest.raises(ValueError, match="out of range"):
        allocator.free([0, bad_slot])
    assert allocator.num_free_slots == 0


def test_reset_frees_everything() -> None:
    allocator = KVSlotAllocator(8, page_size=2)
    allocator.allocate(0, 5, None)
    allocator.reset()
    assert allocator.num_free_slots == 8
    assert allocator.allocate(0, 2, None) == [0, 1]


@settings(max_examples=150, deadline=None)
@given(page_size=st.sampled_from([1, 2, 4]),
       ops=st.lists(st.tuples(st.sampled_from(["new", "grow", "free"]), st.integers(0, 9), st.integers(0, 99)),
                    max_size=40))
def test_random_sequences_keep_pages_disjoint_and_counted(page_size: int, ops: list[tuple[str, int, int]]) -> None:
    """Sequences start, grow or are freed; their pages never overlap, each sequence's slots follow
    its page layout, and free + used == capacity."""
    allocator = KVSlotAllocator(32, page_size=page_size)
    sequences: list[list[int]] = []
    for kind, num_tokens, index in ops:
        if kind == "free" and sequences:
            allocator.free(sequences.pop(index % len(sequences)))
        elif kind == "grow" and sequences or kind == "new":
            seq = sequences[index % len(sequences)] if kind == "grow" else []
            last_slot = seq[-1] if seq else None
            if allocator.can_allocate(len(seq), num_tokens):
                seq.extend(allocator.allocate(len(seq), num_tokens, last_slot))
            else:
                with pytest.raises(MemoryError):
                    allocator.allocate(len(seq), num_tokens, last_slot)
            if kind == "new" and seq:
                sequences.append(seq)
        pages = [s // page_size for seq in sequences for s in seq[::page_size]]
        assert len(set(pages)) == len(pages)
        for seq in sequences:
            assert all(slot % page_size == pos % page_size for pos, slot in enumerate(seq))
            assert all(seq[pos] == seq[pos - 1] + 1 for pos in range(1, len(seq)) if pos % page_size)
        assert allocator.num_free_slots + len(pages) * page_size == allocator.capacity_slots


@pytest.mark.parametrize("page_size", [1, 4])
def test_large_calls_detect_double_frees(page_size: int) -> None:
    """Calls over many pages take a vectorised path; it must keep the same all-or-nothing contract."""
    allocator = KVSlotAllocator(1024 * page_size, page_size=page_size)
    slots = allocator.allocate(0, 600 * page_size, None)
    assert all(allocator.is_allocated(s) for s in slots)
    allocator.free(slots[:100 * page_size])
    free_before = allocator.num_free_slots
    with pytest.raises(ValueError, match="double free"):
        allocator.free(slots[100 * page_size:] + slots[:1])            # one page already free
    assert allocator.num_free_slots == free_before
    assert all(allocator.is_allocated(s) for s in slots[100 * page_size:])
    allocator.free(slots[100 * page_size:])
    assert allocator.num_free_slots == allocator.capacity_slots
    assert sorted(allocator.allocate(0, 1024 * page_size, None)) == list(range(1024 * page_size))


def test_large_call_with_a_repeated_slot_is_a_double_free() -> None:
    allocator = KVSlotAllocator(1024)
    slots = allocator.allocate(0, 600, None)
    with pytest.raises(ValueError, match="double free"):
        allocator.free(slots + slots[300:301])
    assert allocator.num_free_slots == 424
    assert all(allocator.is_allocated(s) for s in slots)


@pytest.mark.parametrize("pieces", [
    [(0, 300), (250, 260)],                        # a run inside another
    [(0, 100), (0, 80)],                           # two runs from one start
    [(200, 300), (100, 201)],                      # overlapping by one page, later run first
    [(i * 20, i * 20 + 10) for i in range(12)] + [(35, 45)],   # many runs (bytes gathered, not sliced)
    [(i, i + 1) for i in range(0, 200, 2)] + [(50, 51)],       # runs of one page
])
def test_large_call_with_overlapping_runs_is_a_double_free(pieces: list[tuple[int, int]]) -> None:
    """A large free finds repeats from its runs of consecutive slots: any two runs sharing a slot."""
    allocator = KVSlotAllocator(1024)
    slots = np.asarray(allocator.allocate(0, 600, None), dtype=np.int32)
    with pytest.raises(ValueError, match="double free"):
        allocator.free(np.concatenate([slots[a:b] for a, b in pieces]))
    assert allocator.num_free_slots == 424
    allocator.free(np.concatenate([slots[a:b] for a, b in pieces[:-1]]))   # distinct without the last piece
    assert allocator.num_free_slots == 424 + len(set(np.concatenate([slots[a:b] for a, b in pieces[:-1]]).tolist()))


@pytest.mark.parametrize("bad", [-1, 1024, 2**31 - 1])
def test_large_call_with_an_out_of_range_slot_frees_nothing(bad: int) -> None:
    allocator = KVSlotAllocator(1024)
    slots = allocator.allocate(0, 600, None)
    for call in (slots + [bad], [bad] + slots, slots[:300] + [bad] + slots[300:]):
        with pytest.raises(ValueError, match="out of range"):
            allocator.free(np.asarray(call, dtype=np.int32))
    assert allocator.num_free_slots == 424


def test_repeated_slots_of_one_page_are_not_a_double_free() -> None:
    allocator = KVSlotAllocator(4 * 256, page_size=4)
    slots = allocator.allocate(0, 4 * 200, None)
    allocator.free(slots + slots[::4])                                  # every page named several times
    assert allocator.num_free_slots == allocator.capacity_slots


class _ReferenceAllocator:
    """page_size 1, one page at a time: a list as the free stack (the top last), the never-used
    range above it, a set of allocated pages."""

    def __init__(self) -> None:
        self.stack: list[int] = []
        self.fresh = 0
        self.allocated: set[int] = set()

    def allocate(self, num: int) -> list[int]:
        out = []
        for _ in range(num):
            if self.stack:
                out.append(self.stack.pop())
            else:
                out.append(self.fresh)
                self.fresh += 1
        self.allocated.update(out)
        return out

    def free(self, slots: list[int]) -> None:
        self.allocated.difference_update(slots)
        self.stack.extend(reversed(slots))


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["alloc", "free", "refree", "repeat", "check"]),
                              st.integers(0, 200), st.integers(0, 10**6)), max_size=30))
def test_lazily_written_bytes_catch_every_double_free(ops: list[tuple[str, int, int]]) -> None:
    """Frees of many pages leave their bytes to be written later; a page freed again before or
    after it was taken back (by a small or a large call, or named twice in one call) is still a
    double free that frees nothing, and slots come out as from a plain LIFO stack."""
    allocator, reference = KVSlotAllocator(512), _ReferenceAllocator()
    held: list[int] = []
    freed: list[int] = []
    for kind, num, seed in ops:
        rng = random.Random(seed)
        if kind == "alloc":
            num = min(num, allocator.num_free_slots)
            got = allocator.allocate(0, num, None)
            assert got == reference.allocate(num)
            held += got
        elif kind == "free" and held:
            rng.shuffle(held)
            chunk, held = held[:num], held[num:]
            allocator.free(chunk)
            reference.free(chunk)
            freed = chunk
        elif kind == "refree" and freed and freed[0] not in held or kind == "repeat" and held:
            rng.shuffle(held)
            extra = freed[:1] if kind == "refree" else held[:1]
            before = allocator.num_free_slots
            with pytest.raises(ValueError, match="double free"):
                allocator.free(held[:max(num, 1)] + extra)
            assert allocator.num_free_slots == before
        elif kind == "check":
            for slot in rng.sample(range(512), 20):
                assert allocator.is_allocated(slot) == (slot in reference.allocated)
        assert allocator.num_free_slots == 512 - len(reference.allocated)
    assert all(allocator.is_allocated(s) for s in held)
    assert allocator.allocate(0, allocator.num_free_slots, None) == reference.allocate(512 - len(reference.allocated))


@settings(max_examples=100, deadline=None)
@given(page_size=st.sampled_from([1, 4]),
       ops=st.lists(st.tuples(st.booleans(), st.integers(0, 300), st.integers(0, 10**6)), max_size=30))
def test_without_double_free_checks_slots_come_out_the_same(page_size: int, ops: list[tuple[bool, int, int]]) -> None:
    """check_double_free=False keeps no byte map: the same calls hand out the same slots."""
    checked, unchecked = KVSlotAllocator(1024, page_size), KVSlotAllocator(1024, page_size, check_double_free=False)
    held: list[list[int]] = []
    for allocate, num, seed in ops:
        if allocate and checked.can_allocate(0, num):
            held.append(checked.allocate(0, num, None))
            assert unchecked.allocate(0, num, None) == held[-1]
        elif not allocate and held:
            seq = held.pop(seed % len(held))
            checked.free(seq)
            unchecked.free(seq)
        assert checked.num_free_slots == unchecked.num_free_slots
    if page_size > 1:                                                  # a page still continues
        first = unchecked.allocate(0, 2, None) if unchecked.can_allocate(0, 3) else None
        assert first is None or unchecked.allocate(2, 1, first[-1]) == [first[-1] + 1]
    with pytest.raises(RuntimeError):
        unchecked.is_allocated(0)
