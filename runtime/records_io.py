"""Writes and reads a run's records: requests.parquet, steps.parquet, summary.json (same schema
in every mode), and has experiments/plots.py draw the run. Torch-free.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from runtime.core.records import REQUEST_COLUMNS, STEP_COLUMNS, StepLog, request_record
from runtime.core.request import Request


def requests_frame(requests: list[Request]) -> pd.DataFrame:
    rows = [request_record(r) for r in sorted(requests, key=lambda r: (r.arrival_s, r.rid))]
    return pd.DataFrame(rows, columns=list(REQUEST_COLUMNS))


def steps_frame(steps: StepLog) -> pd.DataFrame:
    return pd.DataFrame(steps.columns, columns=list(STEP_COLUMNS))


def write_run(out_dir: str | Path, requests: pd.DataFrame, steps: pd.DataFrame, summary: dict,
              plots: bool = True) -> Path:
    """The three record files, then (unless `plots=False`) the run's PNGs and report.md."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    requests.to_parquet(out / "requests.parquet", index=False)
    steps.to_parquet(out / "steps.parquet", index=False)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    if plots:
        from experiments.plots import plot_run   # matplotlib, loaded only when a run is written
        plot_run(out, requests, steps, summary)
    return out


def read_run(run_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(requests, steps, summary) of a run directory written by either mode."""
    run = Path(run_dir)
    return (pd.read_parquet(run / "requests.parquet"), pd.read_parquet(run / "steps.parquet"),
            json.loads((run / "summary.json").read_text()))
