"""Each decode step's per-request contexts in a real run, rebuilt from its records: a request is in the step whose end
its token time equals, reading its prompt plus the tokens it had before (the step's token k reads prompt + k KV
slots, counting the new one). Requests whose last token the step drops (overlap: a finished request's extra row)
have no token time there and are missing; `decode_context_tokens` of the run's step shapes tells how far off the
rebuilt sum is. Torch-free (pandas, numpy).

  python -m experiments.served_decode_contexts RUN_DIR      # how many decode steps rebuild exactly
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

from sim.step_shapes import STEP_SHAPES_FILE


def decode_step_contexts(run_dir: str | Path) -> pd.DataFrame:
    """One row per decode-only step of the run: step_id, end_s, batch_size, decode_context_tokens (recorded) and
    contexts (the rebuilt per-request contexts, a list) with their sum; rows whose sum differs are kept."""
    run = Path(run_dir)
    steps = pd.read_parquet(run / "steps.parquet")
    shapes = pd.read_parquet(run / STEP_SHAPES_FILE).set_index("step_id")
    requests = pd.read_parquet(run / "requests.parquet")
    by_end: dict[float, list[int]] = defaultdict(list)
    for prompt, times in zip(requests["input_tokens"], requests["token_times_s"]):
        for k, t in enumerate(np.asarray(times)):
            if k:                                        # token 0 comes from the prefill
                by_end[float(t)].append(int(prompt) + k)
    rows = []
    for step in steps.itertuples(index=False):
        if step.mode != "decode":
            continue
        shape = shapes.loc[step.step_id]
        contexts = sorted(by_end.get(float(step.end_s), []))
        rows.append({"step_id": int(step.step_id), "end_s": float(step.end_s), "duration_s": step.end_s - step.start_s,
                     "batch_size": int(shape["num_decode_reqs"]),
                     "decode_context_tokens": int(shape["decode_context_tokens"]),
                     "contexts": contexts, "rebuilt_tokens": int(sum(contexts))})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    args = parser.parse_args()
    frame = decode_step_contexts(args.run_dir)
    exact = (frame["rebuilt_tokens"] == frame["decode_context_tokens"]) & (
        frame["contexts"].map(len) == frame["batch_size"])
    print(f"{len(frame)} decode steps, {int(exact.sum())} rebuilt exactly")
    spread = frame[exact]["contexts"].map(lambda c: np.std(c) / np.mean(c) if c else 0.0)
    print(f"contexts' coefficient of variation within a step: median {spread.median():.3f}, p90 {spread.quantile(0.9):.3f}")


if __name__ == "__main__":
    main()
