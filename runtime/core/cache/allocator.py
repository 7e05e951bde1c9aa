"""Paged KV slot allocator: hands out integer slot indices, page by page, deterministically.

Must not import torch, simpy or time. Nothing backs the slots here; the real runtime indexes
its KV tensors with them.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

_VECTOR_MIN = 64   # below this many pages a Python loop beats numpy's call overhead


class KVSlotAllocator:
    """Paged allocator over integer KV slot indices [0, num_slots). A page is page_size consecutive
    slots starting at a multiple of page_size. Capacity is floor(num_slots/page_size)*page_size.

    State: a LIFO free list of page indices (pages freed last are reused first, in the order they
    were passed to `free`) and one byte per page (1 = allocated, a numpy array so that large
    allocations and frees mark their pages at C speed) for double-free detection.
    Initially pages come out in ascending order. Pages never handed out yet are not listed: they
    sit below the free list as the range [fresh_page, num_pages), taken in ascending order once
    the list is empty (the same order a full list would give, without a Python int per page --
    a simulated H200 holds millions of slots, and dp replicas each hold their own allocator).
    With page_size == 1 a page index *is* a slot index, so allocation is one list slice.
    """

    def __init__(self, num_slots: int, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if num_slots < page_size:
            raise ValueError(f"num_slots ({num_slots}) must hold at least one page of {page_size}")
        self.page_size: int = page_size
        self.num_pages: int = num_slots // page_size
        self._free_pages: list[int] = []
        self._fresh_page = 0
        self._page_allocated = np.zeros(self.num_pages, dtype=np.uint8)
        self.reset()

    # -- sizes (slots unless named pages) -------------------------------------------
    @property
    def capacity_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def num_free_pages(self) -> int:
        return len(self._free_pages) + self.num_pages - self._fresh_page

    @property
    def num_free_slots(self) -> int:
        return self.num_free_pages * self.page_size

    @property
    def num_used_slots(self) -> int:
        """Slots in allocated pages (a partly written page counts whole)."""
        return self.capacity_slots - self.num_free_slots

    def is_allocated(self, slot: int) -> bool:
        """Whether the page holding `slot` is allocated. ValueError if out of range."""
        self._check_range(slot, slot)
        return bool(self._page_allocated[slot // self.page_size])

    # -- allocation -------------------------------------------------------------------
    def num_pages_needed(self, start_pos: int, num_tokens: int) -> int:
        """Pages a sequence of length `start_pos` must newly allocate to grow by `num_tokens`:
        one per position p in [start_pos, start_pos + num_tokens) with p % page_size == 0."""
        if start_pos < 0 or num_tokens < 0:
            raise ValueError(f"start_pos and num_tokens must be >= 0, got {start_pos}, {num_tokens}")
        ps = self.page_size
        return -(-(start_pos + num_tokens) // ps) - -(-start_pos // ps)

    def can_allocate(self, start_pos: int, num_tokens: int) -> bool:
        return self.num_pages_needed(start_pos, num_tokens) <= self.num_free_pages

    def allocate(self, start_pos: int, num_tokens: int, last_slot: int | None) -> list[int]:
        """Slots for positions start_pos .. start_pos+num_tokens-1 of one sequence.

        Positions that are not page-aligned continue the page of `last_slot` (the slot of position
        start_pos-1; required when start_pos % page_size != 0, ignored otherwise). Mutates the free
        list. MemoryError if there are not enough free pages; then nothing is allocated.
        """
        needed_pages = self.num_pages_needed(start_pos, num_tokens)
        if needed_pages > self.num_free_pages:
            raise MemoryError(
                f"KV slot allocator out of memory: {num_tokens} tokens at position {start_pos} need "
                f"{needed_pages} pages of {self.page_size} slots, only {self.num_free_pages} free"
            )
        if num_tokens == 0:
            return []
        if self.page_size == 1:
            return self._take_pages(needed_pages)
        slots = self._continue_last_page(start_pos, num_tokens, last_slot)
        ps = self.page_size
        for page in self._take_pages(needed_pages):
            slots.extend(range(page * ps, page * ps + ps))
        del slots[num_tokens:]  # the last page may be only partly used
        return slots

    def _continue_last_page(self, start_pos: int, num_tokens: int, last_slot: int | None) -> list[int]:
        """Slots left in the page of `last_slot` for an unaligned `start_pos` (no mutation)."""
        offset = start_pos % self.page_size
        if offset == 0:
            return []
        if last_slot is None:
            raise ValueError(f"last_slot is required to continue a page at position {start_pos}")
        if last_slot % self.page_size != offset - 1 or not self.is_allocated(last_slot):
            raise ValueError(
                f"last_slot {last_slot} is not an allocated slot at page offset {offset - 1} "
                f"(position {start_pos - 1}, page_size {self.page_size})"
            )
        num_in_page = min(self.page_size - offset, num_tokens)
        return list(range(last_slot + 1, last_slot + 1 + num_in_page))

    def _take_pages(self, num_pages: int) -> list[int]:
        """Pop `num_pages` pages off the free list (C-speed slice), then off the never-used
        range, and mark them allocated."""
        if num_pages == 0:
            return []
        free = self._free_pages
        pages = free[-num_pages:]
        del free[-num_pages:]
        pages.reverse()
        fresh = num_pages - len(pages)
        if fresh:
            pages.extend(range(self._fresh_page, self._fresh_page + fresh))
            self._fresh_page += fresh
        allocated = self._page_allocated
        if num_pages >= _VECTOR_MIN:
            allocated[np.array(pages)] = 1
        else:
            for page in pages:
                allocated[page] = 1
        return pages

    # -- release ----------------------------------------------------------------------
    def free(self, slots: Iterable[int]) -> None:
        """Free every page that contains one of `slots`. ValueError on an out-of-range slot or a
        page that is already free (double free); on error nothing is freed."""
        slots = slots if isinstance(slots, list) else list(slots)
        if not slots:
            return
        self._check_range(min(slots), max(slots))
        ps = self.page_size
        pages = slots if ps == 1 else list(dict.fromkeys(slot // ps for slot in slots))
        allocated = self._page_allocated
        if len(pages) >= _VECTOR_MIN:
            index = np.array(pages)
            flags = allocated[index]
            if not flags.all() or len(set(pages)) != len(pages):
                self._raise_double_free(pages)
            allocated[index] = 0
        else:
            for i, page in enumerate(pages):
                if not allocated[page]:
                    for done in pages[:i]:  # roll back: the call frees all or nothing
                        allocated[done] = 1
                    self._raise_double_free(pages)
                allocated[page] = 0
        self._free_pages.extend(reversed(pages))  # so they come back out in the order given

    def _raise_double_free(self, pages: list[int]) -> None:
        """Name the first page of `pages` that is free or repeated (nothing has been freed)."""
        seen: set[int] = set()
        for page in pages:
            if not self._page_allocated[page] or page in seen:
                ps = self.page_size
                raise ValueError(f"double free of KV page {page} (slots {page * ps}..{page * ps + ps - 1})")
            seen.add(page)

    def reset(self) -> None:
        """Free everything; the next allocations come out in ascending order again."""
        self._free_pages = []
        self._fresh_page = 0
        self._page_allocated = np.zeros(self.num_pages, dtype=np.uint8)

    def _check_range(self, low_slot: int, high_slot: int) -> None:
        if low_slot < 0 or high_slot >= self.capacity_slots:
            bad = low_slot if low_slot < 0 else high_slot
            raise ValueError(f"KV slot {bad} out of range [0, {self.capacity_slots})")
