"""How much longer a step's launch takes after the host has idled, from the profile's idle_launch table
(runtime/profile/idle_launch.py): per gap, the median over the table's steps of (launch after the gap) / (launch
right after the step before). Torch-free (numpy, pandas).
"""
from __future__ import annotations

import numpy as np
import pandas as pd


class IdleLaunch:
    """`factor(idle_s)`: 1 with no idle, the measured ratios at the table's gaps, linear between them and flat
    past the longest. The ratios are taken as at least 1 and never falling with a longer gap (a launch after a
    longer idle is not faster; the table's rounds are few, so a dip is noise)."""

    def __init__(self, rows: pd.DataFrame) -> None:
        ratios = []
        for _, step in rows.groupby(["kind", "new_tokens"]):
            base = step.loc[step["gap_s"] == 0, "launch_s"]
            if base.empty or float(base.iloc[0]) <= 0:
                continue
            later = step[step["gap_s"] > 0]
            ratios.append(pd.Series(later["launch_s"].to_numpy() / float(base.iloc[0]), index=later["gap_s"].to_numpy()))
        if not ratios:
            raise ValueError("idle_launch table: no step with a gap-0 launch to compare with")
        by_gap = pd.concat(ratios).groupby(level=0).median().sort_index()          # [gaps]
        self.gaps_s = np.concatenate(([0.0], by_gap.index.to_numpy(dtype=float)))
        self.factors = np.maximum.accumulate(np.concatenate(([1.0], np.maximum(by_gap.to_numpy(), 1.0))))

    def factor(self, idle_s: float) -> float:
        """Times its usual launch a step takes to launch after the host idled `idle_s` seconds (>= 1)."""
        if idle_s <= 0.0:
            return 1.0
        return float(np.interp(idle_s, self.gaps_s, self.factors))
