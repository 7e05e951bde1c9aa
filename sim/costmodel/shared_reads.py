"""What a decode step pays for KV that several of its requests read (shared radix prefixes), fitted
from a profile's decode_shared table: the fraction of those repeated reads that costs as much as
private KV does. Torch-free.

A step of total context C of which D tokens are repeated reads is priced as a step of C - (1 - f) D
private tokens. f is fitted by least squares on the measured steps with shared prefixes: with p1 the
decode table's time at C (every read private) and p0 at C - D (repeats free), a measured step m is
p0 + f (p1 - p0) to first order, so f = sum (m - p0)(p1 - p0) / sum (p1 - p0)^2, clipped to [0, 1].
Steps where sharing saves little weigh little (their p1 - p0 is small against the noise).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim.costmodel.profile_tables import DecodeTable


@dataclass(frozen=True)
class SharedReadFit:
    fraction: float          # of repeated KV reads, the share priced as private reads
    num_rows: int            # profiled steps with shared prefixes it was fitted on
    median_abs_error: float  # |predicted / measured - 1| on those steps with `fraction`


def fit_shared_read_fraction(rows: pd.DataFrame, tables: dict[str, DecodeTable]) -> SharedReadFit | None:
    """From decode_shared rows (batch_size, total_context_tokens, unique_tokens, path, device_s; groups of
    one request are controls and left out), each priced with `tables[path]`. None without usable rows."""
    used = rows[(rows["group_size"] > 1) & (rows["order"] == "grouped")]
    p1, p0, measured = [], [], []
    for r in used.itertuples(index=False):
        table = tables.get(r.path)
        if not table:
            continue
        # past a batch's last measured context the table goes on along its last segment: shared prefixes
        # let the profile hold longer contexts than private KV did
        times, _ = table.lookup(int(r.batch_size), np.array([r.total_context_tokens, r.unique_tokens], dtype=float))
        if np.isfinite(times).all():
            p1.append(times[0])
            p0.append(times[1])
            measured.append(r.device_s)
    if not p1:
        return None
    p1_a, p0_a, m_a = np.array(p1), np.array(p0), np.array(measured)
    span = p1_a - p0_a
    denominator = float((span * span).sum())
    fraction = float(np.clip(((m_a - p0_a) * span).sum() / denominator, 0.0, 1.0)) if denominator > 0 else 1.0
    error = np.abs((p0_a + fraction * span) / m_a - 1.0)
    return SharedReadFit(fraction, len(p1), float(np.median(error)))
