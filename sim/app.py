"""`mode=sim`: the cost-model executor behind the SimPy driver, through the pipeline both modes share
(runtime/run_mode.py); dp > 1 goes to sim/dp_app.py. Torch-free.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from runtime.build import CoreComponents
from runtime.run_mode import ModeRun, run_mode
from sim.costmodel.base import CostModel
from sim.driver import SimDriver
from sim.executor import SimExecutor
from sim.gc_pause import gc_paused


def sim_run(cfg: DictConfig, core: CoreComponents, cost_model: CostModel) -> ModeRun:
    """SimExecutor behind SimDriver; the loop runs with garbage collection paused (sim/gc_pause.py)."""
    executor = SimExecutor(cost_model, vocab_size=core.model.vocab_size)
    driver = SimDriver(core.scheduler, executor, fast_forward=bool(cfg.sim.fast_forward),
                       max_run_steps=int(cfg.sim.max_run_steps), progress=bool(cfg.progress),
                       overlap=bool(cfg.overlap))
    return ModeRun("sim", driver, context=gc_paused)


def run_sim(cfg: DictConfig, out_dir: str | Path | None = None) -> dict:
    """Simulate `cfg.workload` and write requests.parquet, steps.parquet, summary.json into
    `out_dir` (default: the Hydra run directory). Returns the summary."""
    if int(cfg.dp) > 1 or cfg.get("dp_attention", False):
        from sim.dp_app import run_sim_dp          # replicas behind the router
        return run_sim_dp(cfg, out_dir)
    return run_mode(cfg, sim_run, out_dir)
