"""Where measured profiles live and how the profiled cost model reads them: the tables written by
`python run.py mode=profile` under sim/profiles/<hardware>/<model>/, as monotone interpolants.
Torch-free (numpy, pandas)."""
from __future__ import annotations

from pathlib import Path

PROFILES_DIR = Path(__file__).resolve().parents[1] / "profiles"


def profile_dir(hardware_name: str, model_name: str) -> Path:
    """sim/profiles/<hardware>/<model>/ (it may not exist)."""
    return PROFILES_DIR / hardware_name / model_name
