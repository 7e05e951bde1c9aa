"""Paged KV slot allocator: hands out integer slot indices, page by page, deterministically.

Must not import torch, simpy or time. Nothing backs the slots here; the real runtime indexes
its KV tensors with them.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

_VECTOR_MIN = 64   # below this many slots a Python loop beats numpy's call overhead
SLOT_DTYPE = np.int32   # KV slot and page indices, from the allocator through the radix cache to the runtime
_FEW_RUNS = 8      # up to this many runs of consecutive pages, a double-free check reads them as slices
_FEW_PAGES = 4     # a free of up to this many pages is checked against the unsettled free pages by scans


def pages_needed(start_pos: int, num_tokens: int, page_size: int) -> int:
    """Pages a sequence of length `start_pos` must newly allocate to grow by `num_tokens`: one per
    position p in [start_pos, start_pos + num_tokens) with p % page_size == 0 (every slot allocator's count)."""
    if start_pos < 0 or num_tokens < 0:
        raise ValueError(f"start_pos and num_tokens must be >= 0, got {start_pos}, {num_tokens}")
    return -(-(start_pos + num_tokens) // page_size) - -(-start_pos // page_size)


def _run_bounds(pages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The maximal runs of consecutive ascending pages in `pages` (non-empty): their first pages
    and their last pages, each sorted ascending on its own (`pages`' dtype, [runs] each). Freed
    slots come from radix leaves: runs of ~7 pages on average on the Mooncake trace."""
    last = (pages[1:] != pages[:-1] + 1).nonzero()[0]                   # [runs - 1] a run's last index
    firsts = np.empty(last.size + 1, dtype=pages.dtype)
    firsts[0], firsts[1:] = pages[0], pages[last + 1]
    lasts = np.empty(last.size + 1, dtype=pages.dtype)
    lasts[:-1], lasts[-1] = pages[last], pages[-1]
    firsts.sort()
    lasts.sort()
    return firsts, lasts


def _runs_overlap(firsts: np.ndarray, lasts: np.ndarray) -> bool:
    """Whether two runs share a page, from their first and last pages sorted each on its own
    (`_run_bounds`): runs [f, l] are disjoint iff the i-th smallest last page is below the
    (i+1)-th smallest first page for every i (at any page, the runs started minus the runs ended
    before it is then at most 1). Two sorts of the runs' bounds, not of every page."""
    return bool((lasts[:-1] >= firsts[1:]).any())


class KVSlotAllocator:
    """Paged allocator over integer KV slot indices [0, num_slots). A page is page_size consecutive
    slots starting at a multiple of page_size. Capacity is floor(num_slots/page_size)*page_size.

    State: a LIFO stack of free page indices in a numpy array (pages freed last are reused first,
    in the order they were passed to `free`; it grows downwards from the array's end, so a free
    writes its pages as given and an allocation reads them forwards: one contiguous copy each) and
    one byte per page (1 = allocated) for double-free detection. Pages never handed out yet are
    not on the stack: they sit below it as the range [fresh_page, num_pages), taken in ascending
    order once the stack is empty (the order a full stack would give, with O(1) construction -- a
    simulated H200 holds millions of slots, and dp replicas each hold their own allocator).
    Initially pages come out in ascending order. Slots come out as int32 arrays (`allocate_slots`;
    `allocate` gives a list); `free` takes any sequence of ints (a numpy array is not copied).

    The bytes are written lazily: the pages a large `free` pushes keep reading 1 until the next
    check needs them (`_settle`), and those taken back off the stack before then are never written
    at all (an eviction's pages are mostly re-allocated at once). Every check reads settled bytes,
    so every double free is still caught; it costs a pass over the freed pages to find their runs
    of consecutive pages, a sort of the runs, and a read of the pages' bytes.
    `check_double_free=False` keeps no byte map at all (no double-free checks, no `is_allocated`):
    the slots come out in the same order; a double free then shows only in the slot counts.
    """

    placeholder_slots = None   # real slot indices: holders keep copies of them (CountingSlotAllocator's differ)

    def __init__(self, num_slots: int, page_size: int = 1, check_double_free: bool = True) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if num_slots < page_size:
            raise ValueError(f"num_slots ({num_slots}) must hold at least one page of {page_size}")
        self.page_size: int = page_size
        self.num_pages: int = num_slots // page_size
        self.check_double_free = check_double_free
        self._stack = np.empty(0, dtype=SLOT_DTYPE)   # free pages _stack[_bot:]; the next out is _stack[_bot]
        self._bot = 0
        self._settled_bot = 0     # _stack[_bot:_settled_bot]: free pages whose byte still reads 1
        self._fresh_page = 0
        self._page_allocated = np.zeros(self.num_pages, dtype=np.uint8)
        self.reset()

    # -- sizes (slots unless named pages) -------------------------------------------
    @property
    def capacity_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def num_free_pages(self) -> int:
        return self._stack.size - self._bot + self.num_pages - self._fresh_page

    @property
    def num_free_slots(self) -> int:
        return (self._stack.size - self._bot + self.num_pages - self._fresh_page) * self.page_size

    @property
    def num_used_slots(self) -> int:
        """Slots in allocated pages (a partly written page counts whole)."""
        return self.capacity_slots - self.num_free_slots

    def is_allocated(self, slot: int) -> bool:
        """Whether the page holding `slot` is allocated. ValueError if out of range; RuntimeError
        without double-free checks (no byte map is kept)."""
        self._check_range(slot, slot)
        if not self.check_double_free:
            raise RuntimeError("is_allocated needs the allocator's double-free checks (check_double_free=True)")
        self._settle()
        return bool(self._page_allocated[slot // self.page_size])

    # -- allocation -------------------------------------------------------------------
    def num_pages_needed(self, start_pos: int, num_tokens: int) -> int:
        return pages_needed(start_pos, num_tokens, self.page_size)

    def can_allocate(self, start_pos: int, num_tokens: int) -> bool:
        return self.num_pages_needed(start_pos, num_tokens) <= self.num_free_pages

    def allocate(self, start_pos: int, num_tokens: int, last_slot: int | None) -> list[int]:
        """`allocate_slots` as a Python list."""
        return self.allocate_slots(start_pos, num_tokens, last_slot).tolist()

    def allocate_slots(self, start_pos: int, num_tokens: int, last_slot: int | None) -> np.ndarray:
        """Slots (int32 [num_tokens], a fresh array) for positions start_pos .. start_pos+num_tokens-1
        of one sequence.

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
            return np.empty(0, dtype=SLOT_DTYPE)
        ps = self.page_size
        if ps == 1:
            return self._take_pages(needed_pages)
        head = self._continue_last_page(start_pos, num_tokens, last_slot)
        pages = self._take_pages(needed_pages)
        slots = (pages[:, None] * ps + np.arange(ps, dtype=SLOT_DTYPE)).ravel()   # [pages * ps]
        if head is not None:
            slots = np.concatenate((head, slots))
        return slots[:num_tokens]            # the last page may be only partly used

    def _continue_last_page(self, start_pos: int, num_tokens: int, last_slot: int | None) -> np.ndarray | None:
        """Slots left in the page of `last_slot` for an unaligned `start_pos` (no mutation)."""
        offset = start_pos % self.page_size
        if offset == 0:
            return None
        if last_slot is None:
            raise ValueError(f"last_slot is required to continue a page at position {start_pos}")
        last_slot = int(last_slot)
        if last_slot % self.page_size != offset - 1 or (self.check_double_free and not self.is_allocated(last_slot)):
            raise ValueError(
                f"last_slot {last_slot} is not an allocated slot at page offset {offset - 1} "
                f"(position {start_pos - 1}, page_size {self.page_size})"
            )
        num_in_page = min(self.page_size - offset, num_tokens)
        return np.arange(last_slot + 1, last_slot + 1 + num_in_page, dtype=SLOT_DTYPE)

    def _take_pages(self, num_pages: int) -> np.ndarray:
        """Pop `num_pages` pages off the stack (the top first), then off the never-used range,
        and mark them allocated (pages whose byte still reads 1 need no write). Returns them as a
        fresh int32 array."""
        bot = self._bot
        from_stack = min(num_pages, self._stack.size - bot)
        high = bot + from_stack
        fresh = num_pages - from_stack
        pages = np.empty(num_pages, dtype=SLOT_DTYPE)
        pages[:from_stack] = self._stack[bot:high]
        if high > self._settled_bot and self.check_double_free:   # freed and settled before: bytes back to 1
            self._page_allocated[self._stack[self._settled_bot:high]] = 1
            self._settled_bot = high
        if fresh:
            start = self._fresh_page
            pages[from_stack:] = np.arange(start, start + fresh, dtype=SLOT_DTYPE)
            if self.check_double_free:
                self._page_allocated[start:start + fresh] = 1
            self._fresh_page += fresh
        self._bot = high
        return pages

    def kept_slots(self, slots: Sequence[int]) -> np.ndarray:
        """A copy of `slots` (int32) for a holder that keeps them past the caller's buffer (the
        radix cache's new edges)."""
        return np.array(slots, dtype=SLOT_DTYPE)

    # -- release ----------------------------------------------------------------------
    def free(self, slots: Iterable[int]) -> None:
        """Free every page that contains one of `slots`. ValueError on an out-of-range slot or a
        page that is already free (double free); on error nothing is freed."""
        if isinstance(slots, np.ndarray):
            if slots.size < _VECTOR_MIN:
                self._free_small(slots.tolist())
                return
            index = slots
        else:
            slots = slots if isinstance(slots, list) else list(slots)
            if len(slots) < _VECTOR_MIN:
                self._free_small(slots)
                return
            index = np.fromiter(slots, dtype=np.int64, count=len(slots))
        ps = self.page_size
        if not self.check_double_free:
            self._check_range(int(index.min()), int(index.max()))
            if ps > 1:
                raw = index // ps
                _, first = np.unique(raw, return_index=True)
                index = raw[np.sort(first)]                  # distinct, in the order first named
            self._push(index)
            return
        if ps == 1:
            pages = index
            firsts, lasts = _run_bounds(pages)              # range and repeats from the runs' bounds
            self._check_range(int(min(firsts[0], lasts[0])), int(max(firsts[-1], lasts[-1])))
            repeated = _runs_overlap(firsts, lasts)
        else:
            self._check_range(int(index.min()), int(index.max()))
            raw = index // ps
            _, first = np.unique(raw, return_index=True)
            pages = raw[np.sort(first)]                      # distinct, in the order first named
            repeated, firsts, lasts = False, None, None
        self._settle()
        if repeated or not self._all_allocated(pages, firsts, lasts):
            self._raise_double_free(pages.tolist())
        self._push(pages)                                    # their bytes settle lazily

    def free_parts(self, parts: Sequence[np.ndarray]) -> None:
        """`free` of the slot arrays `parts` joined in the order given (one call, one check)."""
        self.free(parts[0] if len(parts) == 1 else np.concatenate(parts))

    def _all_allocated(self, pages: np.ndarray, firsts: np.ndarray | None, lasts: np.ndarray | None) -> bool:
        """Whether every page of `pages` (in range: checked) reads allocated; by slices when they
        form a few disjoint runs of consecutive pages (`firsts`, `lasts` sorted: the i-th of each
        bound the same run), else one gather."""
        allocated = self._page_allocated
        if firsts is not None and firsts.size <= _FEW_RUNS:
            return all(allocated[f:l + 1].all() for f, l in zip(firsts.tolist(), lasts.tolist()))
        return bool(allocated.take(pages, mode="clip").all())

    def _free_small(self, slots: list[int]) -> None:
        if not slots:
            return
        self._check_range(min(slots), max(slots))
        ps = self.page_size
        pages = slots if ps == 1 else list(dict.fromkeys(slot // ps for slot in slots))
        if not self.check_double_free:
            self._push(np.array(pages, dtype=SLOT_DTYPE))
            return
        allocated = self._page_allocated
        if len(pages) <= _FEW_PAGES and self._settled_bot > self._bot:
            # checked without settling: each page reads allocated, is none of the free pages whose
            # byte still reads 1, and is named once; pushed unsettled (they read 1 until settled)
            unsettled = self._stack[self._bot:self._settled_bot]
            if (len(set(pages)) < len(pages) or not all(allocated[page] for page in pages)
                    or any((unsettled == page).any() for page in pages)):
                self._settle()
                self._raise_double_free(pages)
            self._push(np.array(pages, dtype=SLOT_DTYPE))
            return
        self._settle()
        for i, page in enumerate(pages):
            if not allocated[page]:
                for done in pages[:i]:  # roll back: the call frees all or nothing
                    allocated[done] = 1
                self._raise_double_free(pages)
            allocated[page] = 0
        self._push(np.array(pages, dtype=SLOT_DTYPE))
        self._settled_bot = self._bot                        # written already

    def _settle(self) -> None:
        """Write 0 to the bytes of the free pages that still read 1 (every check reads bytes)."""
        if self._bot < self._settled_bot:
            self._page_allocated[self._stack[self._bot:self._settled_bot]] = 0
            self._settled_bot = self._bot

    def _push(self, pages: np.ndarray) -> None:
        """Put freed pages on the stack so that they come back out in the order given."""
        bot, n = self._bot, pages.size
        if n > bot:                                          # grown at the bottom, the free pages kept at the end
            size = self._stack.size
            grown = np.empty(max(2 * size, size - bot + n, 1024), dtype=SLOT_DTYPE)
            shift = grown.size - size
            grown[bot + shift:] = self._stack[bot:]
            self._stack = grown
            bot += shift
            self._settled_bot += shift
        self._stack[bot - n:bot] = pages
        self._bot = bot - n

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
        self._stack = np.empty(0, dtype=SLOT_DTYPE)
        self._bot = 0
        self._settled_bot = 0
        self._fresh_page = 0
        self._page_allocated = np.zeros(self.num_pages, dtype=np.uint8)

    def _check_range(self, low_slot: int, high_slot: int) -> None:
        if low_slot < 0 or high_slot >= self.capacity_slots:
            bad = low_slot if low_slot < 0 else high_slot
            raise ValueError(f"KV slot {bad} out of range [0, {self.capacity_slots})")
