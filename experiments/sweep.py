"""Turns a sweep directory (a Hydra multirun root, or any folder of run directories) into one
table: one row per run, its overridden keys and its summary metrics. Torch-free.

  from experiments.sweep import load_sweep
  table = load_sweep("multirun/2026-11-22/10-00-00")
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

SWEEP_PARQUET, SWEEP_CSV = "sweep.parquet", "sweep.csv"
DISTRIBUTIONS = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
METRIC_COLUMNS = (
    "num_requests", "num_finished", "num_aborted", "duration_s", "requests_per_s", "input_tokens_per_s",
    "output_tokens_per_s", "cache_hit_rate", "num_steps", "num_retractions", "kv_capacity_tokens",
    *(f"{d[:-2]}_{stat}_s" for d in DISTRIBUTIONS for stat in ("mean", "p50", "p90", "p99")),
    "wall_time_s",
)


def summary_metrics(summary: dict) -> dict:
    """summary.json flattened into the METRIC_COLUMNS (ttft_p99_s, output_tokens_per_s, ...)."""
    row = {key: summary.get(key) for key in METRIC_COLUMNS if key in summary}
    row.update(summary.get("throughput", {}))
    for dist in DISTRIBUTIONS:
        for stat, value in (summary.get(dist) or {}).items():
            row[f"{dist[:-2]}_{stat}_s"] = value
    return {key: row.get(key) for key in METRIC_COLUMNS}


def parse_overrides(lines: list[str]) -> dict[str, str]:
    """Hydra override strings (`policy=lpm`, `+experiment=x`, `kv.capacity_tokens=null`) as
    {key: value}; deletions (`~key`) are skipped."""
    out = {}
    for line in lines:
        key, sep, value = str(line).partition("=")
        if sep and not key.startswith("~"):
            out[key.lstrip("+")] = value
    return out


def run_overrides(run_dir: Path) -> dict[str, str]:
    path = run_dir / ".hydra" / "overrides.yaml"
    return parse_overrides(list(OmegaConf.load(path))) if path.exists() else {}


def as_numbers(column: pd.Series) -> pd.Series:
    """Override values are strings; make a column numeric when every value reads as a number
    (`null` stays missing), so sweeps over loads and sizes sort and plot as numbers."""
    values = column.replace({"null": None})
    numeric = pd.to_numeric(values, errors="coerce")
    if numeric.notna().sum() != values.notna().sum():
        return column
    whole = numeric.dropna()
    return numeric.astype("Int64") if len(whole) and (whole == whole.round()).all() else numeric


def run_dirs(sweep_dir: Path) -> list[Path]:
    """Run directories under `sweep_dir` (any depth), in job order when named by job number."""
    dirs = [p.parent for p in sweep_dir.rglob("summary.json")]
    return sorted(dirs, key=lambda d: (len(d.parts), int(d.name) if d.name.isdigit() else 0, str(d)))


def load_sweep(sweep_dir: str | Path) -> pd.DataFrame:
    """One row per run under `sweep_dir`: `run` (its path relative to the sweep), the overridden
    keys (one column each; numeric where they read as numbers), then the summary metrics."""
    root = Path(sweep_dir)
    rows, override_keys = [], []
    for run in run_dirs(root):
        overrides = run_overrides(run)
        override_keys += [k for k in overrides if k not in override_keys]
        summary = json.loads((run / "summary.json").read_text())
        rows.append({"run": str(run.relative_to(root)), **overrides, "mode": summary.get("mode"),
                     **summary_metrics(summary)})
    columns = ["run", *override_keys, *(["mode"] if "mode" not in override_keys else []), *METRIC_COLUMNS]
    table = pd.DataFrame(rows, columns=columns)
    for key in override_keys:
        table[key] = as_numbers(table[key])
    return table


def write_sweep_table(sweep_dir: str | Path) -> pd.DataFrame:
    """load_sweep, written as sweep.parquet and sweep.csv at the root of `sweep_dir`."""
    table = load_sweep(sweep_dir)
    table.to_parquet(Path(sweep_dir) / SWEEP_PARQUET, index=False)
    table.to_csv(Path(sweep_dir) / SWEEP_CSV, index=False)
    return table


def varying_keys(table: pd.DataFrame) -> list[str]:
    """The override columns whose value differs between runs (what the sweep swept)."""
    keys = [c for c in table.columns if c not in ("run", "mode", *METRIC_COLUMNS)]
    return [k for k in keys if table[k].map(str).nunique() > 1]


def format_sweep(table: pd.DataFrame) -> str:
    """A terminal table: the swept keys, then TTFT/TPOT (ms), throughput, hit rate, aborts."""
    keys = varying_keys(table)
    view = table[keys].astype(object).where(table[keys].notna(), "null")
    for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"):
        view[key[:-2] + "_ms"] = (table[key].astype(float) * 1e3).round(1)
    view["out_tok_per_s"] = table["output_tokens_per_s"].astype(float).round(0)
    view["hit_rate"] = table["cache_hit_rate"].astype(float).round(3)
    view["aborted"] = table["num_aborted"]
    return view.to_string(index=False)
