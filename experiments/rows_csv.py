"""Writes a benchmark's result rows as one CSV file (header from the first row's keys). Torch-free."""
from __future__ import annotations

import csv
from pathlib import Path


def write_rows_csv(path: str | Path, rows: list[dict]) -> Path:
    """`rows` (dicts with the same keys, at least one) to `path`, its parent directories made; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path
