"""The counting slot allocator keeps the paged allocator's counts: the same calls leave the same
free pages, run out of memory at the same call, and hand out slot arrays of the same lengths."""
from __future__ import annotations

import random

import numpy as np
import pytest

from runtime.core.cache.allocator import KVSlotAllocator
from runtime.core.cache.counting_allocator import CountingSlotAllocator


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("seed", range(5))
def test_same_counts_as_the_paged_allocator(page_size, seed):
    rng = random.Random(seed)
    paged, counting = KVSlotAllocator(2048, page_size), CountingSlotAllocator(2048, page_size)
    held: list[tuple[np.ndarray, np.ndarray]] = []      # one sequence each: (paged slots, counting slots)
    for _ in range(400):
        if held and rng.random() < 0.45:
            i = rng.randrange(len(held))
            slots_p, slots_c = held.pop(i)
            cut = rng.randrange(0, len(slots_p) + 1, page_size) if len(slots_p) else 0   # a page-aligned tail
            paged.free(slots_p[cut:])
            counting.free(slots_c[cut:])
            if cut and rng.random() < 0.5:
                held.append((slots_p[:cut], slots_c[:cut]))
            else:
                paged.free(slots_p[:cut])
                counting.free(slots_c[:cut])
        elif held and rng.random() < 0.5:           # grow a sequence (an unaligned start continues its page)
            i = rng.randrange(len(held))
            slots_p, slots_c = held[i]
            n = rng.randint(0, 300)
            last = int(slots_p[-1]) if len(slots_p) else None
            try:
                new_p = paged.allocate_slots(len(slots_p), n, last)
            except MemoryError:
                with pytest.raises(MemoryError):
                    counting.allocate_slots(len(slots_c), n, 0 if last is not None else None)
                continue
            new_c = counting.allocate_slots(len(slots_c), n, 0 if last is not None else None)
            assert len(new_c) == len(new_p) == n
            held[i] = (np.concatenate((slots_p, new_p)), np.concatenate((slots_c, new_c)))
        else:
            n = rng.randint(1, 700)
            try:
                new_p = paged.allocate_slots(0, n, None)
            except MemoryError:
                with pytest.raises(MemoryError):
                    counting.allocate_slots(0, n, None)
                continue
            held.append((new_p, counting.allocate_slots(0, n, None)))
        assert counting.num_free_pages == paged.num_free_pages
        assert counting.num_free_slots == paged.num_free_slots and counting.num_used_slots == paged.num_used_slots
        assert counting.can_allocate(3, 9) == paged.can_allocate(3, 9)
    counting.free_parts([c for _, c in held])
    paged.free_parts([p for p, _ in held])
    assert counting.num_free_pages == paged.num_free_pages == 2048 // page_size


def test_slots_are_read_only_views_and_an_overflowing_free_is_a_double_free():
    alloc = CountingSlotAllocator(100)
    slots = alloc.allocate_slots(0, 60, None)
    assert slots.dtype == np.int32 and len(slots) == 60 and alloc.num_free_slots == 40
    with pytest.raises(ValueError):
        slots[0] = 1                      # placeholders: nobody may write into them
    alloc.free(slots[:30])
    alloc.free_count(30)
    assert alloc.num_free_slots == 100
    with pytest.raises(ValueError, match="double free"):
        alloc.free(slots[:1])
    assert alloc.num_free_slots == 100    # nothing freed on error
    with pytest.raises(MemoryError):
        alloc.allocate_slots(0, 101, None)
    with pytest.raises(RuntimeError):
        alloc.is_allocated(0)
    alloc.allocate_slots(0, 100, None)
    alloc.reset()
    assert alloc.num_free_slots == 100
