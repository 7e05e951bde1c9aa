"""Runs an experiment's sweep (`python run.py -m +experiment=NAME ...`) from Python, as the
notebooks do, and returns its sweep table; tells whether a workload's trace file is present.
Torch-free.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

from experiments.compose import compose_config
from experiments.sweep import SWEEP_PARQUET

REPO = Path(__file__).resolve().parent.parent
SMALL_ENV = "TWINSERVE_NOTEBOOK_SMALL"      # "1": notebooks run a small slice (CI)
STUDY_DIR_ENV = "TWINSERVE_STUDY_DIR"       # where studies write their sweeps (default outputs/studies)


def small_run() -> bool:
    return os.environ.get(SMALL_ENV, "0") == "1"


def study_dir(name: str) -> Path:
    """The folder of one study's sweeps: $TWINSERVE_STUDY_DIR/NAME, else outputs/studies/NAME."""
    return Path(os.environ.get(STUDY_DIR_ENV) or REPO / "outputs" / "studies") / name


def run_sweep(experiment: str, overrides: list[str], sweep_dir: str | Path) -> pd.DataFrame:
    """Run the experiment's multirun into `sweep_dir` (emptied first); its sweep table."""
    sweep_dir = Path(sweep_dir).resolve()
    shutil.rmtree(sweep_dir, ignore_errors=True)
    command = [sys.executable, str(REPO / "run.py"), "-m", f"+experiment={experiment}", *overrides,
               f"hydra.sweep.dir={sweep_dir}"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"sweep failed ({' '.join(command[2:])}):\n{tail}")
    return pd.read_parquet(sweep_dir / SWEEP_PARQUET)


def trace_present(workload: str) -> bool:
    """True when the workload option reads no file, or its default file exists."""
    path = compose_config([f"workload={workload}"]).workload.get("path")
    if path is None:
        return True
    path = Path(path)
    return (path if path.is_absolute() else REPO / path).exists()
