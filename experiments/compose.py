"""Compose the project's Hydra config from Python (benchmarks, tests, notebooks), with overrides,
exactly as `python run.py ...` would. Torch-free."""
from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

from runtime.config_schema import register_schemas

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def compose_config(overrides: list[str] | None = None, output_dir: str | None = None) -> DictConfig:
    """The composed run config. `output_dir` replaces the Hydra run directory (absent here)."""
    register_schemas()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides or []))
    with open_dict(cfg):
        cfg.output_dir = output_dir or "outputs/composed"
    return cfg
