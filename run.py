"""Hydra entry point: compose conf/, then hand the config to the driver of `mode`.

  python run.py mode=sim policy=lpm
  python run.py -m mode=sim policy=fcfs,lpm eviction=lru,lfu
"""
from __future__ import annotations

import sys

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig

from runtime.config_schema import register_schemas
from runtime.core.layout import LayoutError

register_schemas()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        instantiate(cfg.mode)(cfg)
    except LayoutError as err:      # a layout the model or GPU cannot take: one line, no traceback
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
