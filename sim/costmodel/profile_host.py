"""The host table of a profile: schedule + commit time of the real Scheduler per step (what overlap
scheduling hides behind the device), by decode batch size and by prefill requests and tokens.
Torch-free (numpy, pandas)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from sim.costmodel.profile_tables import Curve


class HostTable:
    """decode: interpolated over batch size; prefill (and mixed): a least-squares line in requests and
    new tokens, a + b * requests + c * tokens with every coefficient >= 0 (few, scattered points)."""

    def __init__(self, rows: pd.DataFrame) -> None:
        host = rows["schedule_s"] + rows["commit_s"]
        decode = rows["kind"] == "decode"
        self.decode = Curve(rows.loc[decode, "num_reqs"], host[decode]) if decode.any() else None
        prefill = rows[~decode]
        if len(prefill) >= 3:
            design = np.column_stack([np.ones(len(prefill)), prefill["num_reqs"], prefill["new_tokens"]])
            coef = np.linalg.lstsq(design, host[~decode].to_numpy(), rcond=None)[0]
            self.prefill_coef = np.clip(coef, 0.0, None)
        else:
            self.prefill_coef = np.array([float(host[~decode].mean()) if len(prefill) else 0.0, 0.0, 0.0])

    def host_s(self, num_extends: int, extend_tokens: int, num_decodes: int) -> float:
        if num_extends == 0:
            return float(self.decode(num_decodes)) if self.decode is not None and num_decodes else 0.0
        a, b, c = self.prefill_coef
        return float(a + b * (num_extends + num_decodes) + c * (extend_tokens + num_decodes))
