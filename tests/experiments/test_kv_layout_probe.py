"""experiments.kv_layout_probe.slot_layout: every layout gives each request `context` distinct slots, no slot
is shared between requests, all lie in the written pool, and the layouts differ as named."""
from __future__ import annotations

import numpy as np
import pytest

from experiments.kv_layout_probe import LAYOUTS, slot_layout


@pytest.mark.parametrize("kind", LAYOUTS)
def test_layouts_are_disjoint_and_inside_the_pool(kind):
    rows = slot_layout(kind, batch=8, context=16, pool_slots=1000, seed=3)
    flat = np.concatenate(rows)
    assert [len(r) for r in rows] == [16] * 8
    assert len(np.unique(flat)) == 8 * 16 and flat.min() >= 0 and flat.max() < 1000


def test_the_layouts_are_what_they_say():
    contiguous, strided, scattered = (slot_layout(k, 4, 8, 10_000, seed=1) for k in LAYOUTS)
    assert all(np.all(np.diff(r) == 1) for r in contiguous)
    assert all(np.all(np.diff(r) == 4) for r in strided)
    assert not all(np.all(np.diff(r) == 1) for r in scattered) and np.concatenate(scattered).max() > 32


def test_a_layout_larger_than_the_pool_is_refused():
    with pytest.raises(ValueError, match="exceed"):
        slot_layout("scattered", 4, 100, 200)
