"""Hydra callback: at the end of every multirun, write the sweep table (sweep.parquet, sweep.csv)
at the multirun root and print it. Configured in conf/config.yaml under hydra.callbacks.
Torch-free.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from experiments.sweep import SWEEP_CSV, SWEEP_PARQUET, format_sweep, write_sweep_table


class SweepTableCallback(Callback):
    """Keeps the sweep directory resolved at the start (its name holds the start time)."""

    def __init__(self) -> None:
        self.sweep_dir: Path | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.sweep_dir = Path(config.hydra.sweep.dir)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = self.sweep_dir or Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        table = write_sweep_table(sweep_dir)
        print(f"sweep of {len(table)} runs -> {sweep_dir / SWEEP_PARQUET} (and {SWEEP_CSV})")
        if len(table):
            print(format_sweep(table))
