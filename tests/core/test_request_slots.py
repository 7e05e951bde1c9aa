"""A request's KV slots: an int32 view of its own growable buffer."""
from __future__ import annotations

import numpy as np

from runtime.core.request import Request, SamplingParams


def test_slots_are_a_copy_that_grows_and_takes_slice_writes() -> None:
    req = Request("r", [1, 2, 3], SamplingParams(max_new_tokens=2), 0.0)
    assert req.kv_slots.dtype == np.int32 and req.num_kv_slots == 0
    given = [7, 8]
    req.kv_slots = given
    given.append(9)                                   # the request holds its own copy
    assert req.kv_slots.tolist() == [7, 8]
    for slot in range(100, 140):                      # past the first buffer: it grows, keeps the head
        req.append_kv_slots(np.array([slot], dtype=np.int32))
    assert req.kv_slots.tolist() == [7, 8, *range(100, 140)] and req.num_kv_slots == 42
    req.kv_slots[:2] = [20, 21]                       # re-pinned on the cache's copy
    assert req.kv_slots[:3].tolist() == [20, 21, 100]
    req.kv_slots = ()
    assert req.num_kv_slots == 0 and len(req.kv_slots) == 0
