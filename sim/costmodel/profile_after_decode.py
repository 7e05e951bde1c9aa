"""How much of its back-to-back excess a prefill step still pays right behind a decode run, from the profile's
prefill_after_decode table (runtime/profile/app.py: one sequence's prefill timed back to back, with its launch
hidden, and launched right behind decode steps, in one sitting). Torch-free (numpy, pandas).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

MIN_EXCESS_SHARE = 0.01     # points whose back-to-back excess is under 1% of the step: the share is noise there


class AfterDecode:
    """`saved_share(tokens)`: of a step's back-to-back excess over its kernels alone (device_s - device_alone_s),
    the share a step of `tokens` new tokens does not pay when it runs right behind a decode run:
    (device_s - after_decode_s) / (device_s - device_alone_s) at the table's points, within [0, 1], linear in
    tokens between them and flat outside. Points whose excess is below MIN_EXCESS_SHARE of their time are left
    out; a table with none left saves the whole excess (the rule without the table)."""

    def __init__(self, rows: pd.DataFrame) -> None:
        rows = rows.sort_values("new_tokens")
        excess = rows["device_s"] - rows["device_alone_s"]
        kept = rows[excess > MIN_EXCESS_SHARE * rows["device_s"]]
        shares = (kept["device_s"] - kept["after_decode_s"]) / (kept["device_s"] - kept["device_alone_s"])
        self.tokens = kept["new_tokens"].to_numpy(dtype=float)                 # [points]
        self.shares = np.clip(shares.to_numpy(dtype=float), 0.0, 1.0)          # [points]

    def saved_share(self, tokens: int) -> float:
        if not len(self.tokens):
            return 1.0
        return float(np.interp(tokens, self.tokens, self.shares))
