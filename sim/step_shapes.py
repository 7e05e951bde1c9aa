"""Every step's full shape (step_shapes.parquet, one row per step in step order): what a real run records
beside its steps so that any cost model can be scored later on the plans the run really made
(experiments/fidelity_table.py). Torch-free (pandas)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from sim.costmodel.base import StepShape

STEP_SHAPES_FILE = "step_shapes.parquet"


def shape_row(step_id: int, shape: StepShape) -> dict:
    return {"step_id": step_id, "extend_new_tokens": list(shape.extend_new_tokens),
            "extend_prefix_tokens": list(shape.extend_prefix_tokens), "num_decode_reqs": shape.num_decode_reqs,
            "decode_context_tokens": shape.decode_context_tokens, "decode_shared_tokens": shape.decode_shared_tokens,
            "decode_context_lens": list(shape.decode_context_lens)}


def shapes_frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["step_id", "extend_new_tokens", "extend_prefix_tokens", "num_decode_reqs",
                                       "decode_context_tokens", "decode_shared_tokens", "decode_context_lens"])


def write_step_shapes(run_dir: str | Path, shapes: pd.DataFrame) -> None:
    shapes.to_parquet(Path(run_dir) / STEP_SHAPES_FILE, index=False)


def read_shapes(run_dir: str | Path) -> list[StepShape]:
    """The run's step shapes in step order (rows as steps.parquet has them)."""
    frame = pd.read_parquet(Path(run_dir) / STEP_SHAPES_FILE)
    if "decode_shared_tokens" not in frame:       # recorded before shared prefixes were priced
        frame["decode_shared_tokens"] = 0
    if "decode_context_lens" not in frame:        # recorded before per-request lengths were
        frame["decode_context_lens"] = [()] * len(frame)
    return [StepShape(tuple(int(x) for x in r.extend_new_tokens), tuple(int(x) for x in r.extend_prefix_tokens),
                      int(r.num_decode_reqs), int(r.decode_context_tokens), int(r.decode_shared_tokens),
                      tuple(int(x) for x in r.decode_context_lens))
            for r in frame.itertuples(index=False)]
