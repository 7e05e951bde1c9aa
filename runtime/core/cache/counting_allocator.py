"""Counting KV slot allocator for the simulator: keeps only how many pages are free.

Must not import torch, simpy or time. In `mode=sim` nothing is stored at a slot, and which slot a
token gets never changes a scheduling decision (the scheduler, the radix cache and the cost model
read slot counts, never slot values), so this allocator hands out O(1) read-only views of one shared
array instead of real slot indices, and a free only adds the pages freed to a counter. The real
runtime, whose slots address its KV tensors, keeps `KVSlotAllocator`.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from runtime.core.cache.allocator import SLOT_DTYPE, KVSlotAllocator, pages_needed


class CountingSlotAllocator:
    """`KVSlotAllocator`'s interface over a free-page count alone.

    Sizes, `num_pages_needed`, `can_allocate` and the out-of-memory error are the paged
    allocator's (the same counts after the same calls). Slots come out as read-only views of one
    shared int32 array (their values mean nothing: zeros), so callers copy them into their own
    buffers as they do with the paged allocator's slots, and writing into them fails.
    `free` counts the pages of the slots it gets, which must start at a page boundary (every
    caller in the core frees page-aligned tails, duplicates and radix edges): ceil(len / page_size)
    pages. A double free cannot be told from a free here; it shows as more free pages than the
    capacity (raised at once when it overflows the pool) or in the end-of-run slot count
    (`runtime.build.leaked_slots`, free + cached against the capacity).
    """

    check_double_free = False   # no per-page state: nothing to check a page against

    def __init__(self, num_slots: int, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if num_slots < page_size:
            raise ValueError(f"num_slots ({num_slots}) must hold at least one page of {page_size}")
        self.page_size: int = page_size
        self.num_pages: int = num_slots // page_size
        self._slots = np.zeros(self.num_pages * page_size, dtype=SLOT_DTYPE)
        self._slots.flags.writeable = False
        # every slot it hands out is a view of this one array: a holder may keep a view of it as its own
        # slots (`Request.hold_placeholder_slots`) instead of copying placeholders into a buffer
        self.placeholder_slots: np.ndarray = self._slots
        self._free_pages = self.num_pages

    # -- sizes (slots unless named pages) -------------------------------------------
    @property
    def capacity_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def num_free_pages(self) -> int:
        return self._free_pages

    @property
    def num_free_slots(self) -> int:
        return self._free_pages * self.page_size

    @property
    def num_used_slots(self) -> int:
        """Slots in allocated pages (a partly written page counts whole)."""
        return (self.num_pages - self._free_pages) * self.page_size

    def is_allocated(self, slot: int) -> bool:
        """Not known here: slots have no identity (RuntimeError)."""
        raise RuntimeError("is_allocated needs the paged allocator (kv.slot_allocator=paged)")

    # -- allocation -------------------------------------------------------------------
    def num_pages_needed(self, start_pos: int, num_tokens: int) -> int:
        return pages_needed(start_pos, num_tokens, self.page_size)

    def can_allocate(self, start_pos: int, num_tokens: int) -> bool:
        return self.num_pages_needed(start_pos, num_tokens) <= self._free_pages

    def allocate(self, start_pos: int, num_tokens: int, last_slot: int | None) -> list[int]:
        """`allocate_slots` as a Python list."""
        return self.allocate_slots(start_pos, num_tokens, last_slot).tolist()

    def allocate_slots(self, start_pos: int, num_tokens: int, last_slot: int | None) -> np.ndarray:
        """Placeholder slots (a read-only int32 view [num_tokens]) for positions start_pos ..
        start_pos+num_tokens-1 of one sequence; the pages they newly need leave the free count.
        MemoryError if there are not enough free pages; then nothing is allocated."""
        ps = self.page_size
        needed = num_tokens if ps == 1 else self.num_pages_needed(start_pos, num_tokens)
        if needed > self._free_pages or needed < 0:
            if needed < 0:
                raise ValueError(f"start_pos and num_tokens must be >= 0, got {start_pos}, {num_tokens}")
            raise MemoryError(
                f"KV slot allocator out of memory: {num_tokens} tokens at position {start_pos} need "
                f"{needed} pages of {ps} slots, only {self._free_pages} free"
            )
        if ps > 1 and start_pos % ps and last_slot is None:
            raise ValueError(f"last_slot is required to continue a page at position {start_pos}")
        self._free_pages -= needed
        return self._slots[:num_tokens]

    def kept_slots(self, slots: Sequence[int]) -> np.ndarray:
        """What a holder keeps of `slots` past the caller's buffer (the radix cache's new edges):
        a read-only placeholder view of the same length, no copy (the values mean nothing)."""
        return self._slots[:len(slots)]

    # -- release ----------------------------------------------------------------------
    def free(self, slots: Sequence[int]) -> None:
        """Return the pages of `slots` (starting at a page boundary): ceil(len / page_size) pages.
        ValueError, and nothing freed, if that would leave more pages free than the pool holds."""
        self.free_count(len(slots))

    def free_parts(self, parts: Sequence[np.ndarray]) -> None:
        """`free` of several slot arrays at once (each starting at a page boundary)."""
        ps = self.page_size
        if ps == 1:
            self._add_free(sum(map(len, parts)))
        else:
            self._add_free(sum(-(-len(part) // ps) for part in parts))

    def free_count(self, num_slots: int) -> None:
        """`free` of `num_slots` slots starting at a page boundary, by their count alone."""
        ps = self.page_size
        self._add_free(num_slots if ps == 1 else -(-num_slots // ps))

    def _add_free(self, pages: int) -> None:
        free = self._free_pages + pages
        if free > self.num_pages:
            raise ValueError(f"free of {pages} KV pages with {self._free_pages} of {self.num_pages} "
                             "free already: a double free")
        self._free_pages = free

    def reset(self) -> None:
        """Free everything."""
        self._free_pages = self.num_pages


SlotAllocator = KVSlotAllocator | CountingSlotAllocator   # what the radix cache and the KV manager take
