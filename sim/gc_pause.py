"""Garbage collection paused around a simulation loop: collect once, freeze the survivors (the
trace, the tree built so far) so no later collection scans them, and keep the collector off while
the loop runs. The loop allocates millions of short-lived lists and objects whose generation-0
collections otherwise cost about a fifth of the wall time; nothing it keeps is cyclic garbage
worth reclaiming before it ends. Imports neither torch nor simpy.
"""
from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Run the body with the collector off and the heap so far frozen; restore both after. What the
    body allocated and kept ends in the oldest generation (not in the youngest, whose first
    collection after the loop would otherwise scan every object the loop made)."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()      # the loop's survivors join the frozen heap: the youngest generation is empty
        gc.unfreeze()    # and all of it goes to the oldest, as survivors of collections would
        if was_enabled:
            gc.enable()
