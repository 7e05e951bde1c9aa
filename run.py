"""Hydra entry point: compose conf/, then hand the config to the driver of `mode`.

  python run.py mode=sim policy=lpm
  python run.py -m mode=sim policy=fcfs,lpm eviction=lru,lfu
"""
from __future__ import annotations

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig

from runtime.config_schema import register_schemas

register_schemas()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    instantiate(cfg.mode)(cfg)


if __name__ == "__main__":
    main()
