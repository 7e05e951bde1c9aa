"""Hydra entry point: compose conf/, then hand the config to the driver of `mode`.

  python run.py mode=sim policy=lpm
  python run.py -m mode=sim policy=fcfs,lpm eviction=lru,lfu

A bad configuration or input found after composition (layout, KV pool, trace file, workload
argument) ends a single run with one line and status 2; HYDRA_FULL_ERROR=1 shows the traceback.
"""
from __future__ import annotations

import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig

from runtime.config_schema import register_schemas
from runtime.distributed.errors import RankFailed

register_schemas()

# runtime.core.layout.LayoutError is a ValueError; RankFailed names a rank that died in a multi-GPU run
USER_ERRORS = (ValueError, FileNotFoundError, RankFailed)


def user_error(err: BaseException | None) -> BaseException | None:
    """The configuration/input error behind `err` (Hydra wraps errors raised while instantiating
    a config node), or None for anything else (a bug keeps its traceback)."""
    while err is not None:
        if isinstance(err, USER_ERRORS):
            return err
        err = err.__cause__
    return None


def served_nothing(summary: object) -> str | None:
    """Why a finished run served nothing (no request finished), or None."""
    if not isinstance(summary, dict) or summary.get("num_finished", 1):
        return None
    return (f"no request finished ({summary.get('num_requests', 0)} recorded, {summary.get('num_aborted', 0)} "
            f"aborted): a prompt longer than the KV pool ({summary.get('kv_capacity_tokens', '?')} tokens) or "
            "the model's context is aborted; raise kv.capacity_tokens or shorten the workload's prompts")


def fail(message: str) -> None:
    print(f"error: {message}  (HYDRA_FULL_ERROR=1 shows the traceback)", file=sys.stderr)
    sys.exit(2)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    one_line = HydraConfig.get().mode == RunMode.RUN and os.environ.get("HYDRA_FULL_ERROR") != "1"
    try:
        summary = instantiate(cfg.mode)(cfg)
    except Exception as err:
        cause = user_error(err)
        if cause is None or not one_line:
            raise
        fail(str(cause).splitlines()[0] if str(cause) else type(cause).__name__)
    reason = served_nothing(summary)
    if reason is not None and HydraConfig.get().mode == RunMode.RUN:
        fail(reason)
    if reason is not None:                          # one run of a sweep: its row shows the aborts
        print(f"warning: {reason}", file=sys.stderr)


if __name__ == "__main__":
    main()
