"""`mode=sim`: build the components, simulate the workload, write records and print a summary.

Torch-free.
"""
from __future__ import annotations

import time
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig

from runtime.build import build_core, check_workload_fits, describe, leaked_slots
from runtime.metrics import format_summary, summarize
from runtime.records_io import requests_frame, steps_frame, write_run
from sim.driver import SimDriver
from sim.gc_pause import gc_paused
from sim.predictor import build_cost_model
from sim.executor import SimExecutor


def run_sim(cfg: DictConfig, out_dir: str | Path | None = None) -> dict:
    """Simulate `cfg.workload` and write requests.parquet, steps.parquet, summary.json into
    `out_dir` (default: the Hydra run directory). Returns the summary."""
    if int(cfg.dp) > 1 or cfg.get("dp_attention", False):
        from sim.dp_app import run_sim_dp          # replicas behind the router (imports this module)
        return run_sim_dp(cfg, out_dir)
    wall_start = time.perf_counter()
    core = build_core(cfg)
    cost_model = build_cost_model(cfg, core)
    executor = SimExecutor(cost_model, vocab_size=core.model.vocab_size)
    specs = instantiate(cfg.workload).requests()
    check_workload_fits(core, specs)
    if cfg.print_summary:
        print(describe(core))
    driver = SimDriver(core.scheduler, executor, fast_forward=bool(cfg.sim.fast_forward),
                       max_run_steps=int(cfg.sim.max_run_steps), progress=bool(cfg.progress),
                       overlap=bool(cfg.overlap))
    with gc_paused():                      # the loop's garbage is short-lived; see sim/gc_pause.py
        outcome = driver.run(specs)
    requests, steps = requests_frame(outcome.requests), steps_frame(outcome.steps)
    summary = summarize(requests, steps, mode="sim", wall_time_s=time.perf_counter() - wall_start)
    summary["kv_capacity_tokens"] = core.kv_capacity_tokens
    summary["leaked_kv_slots"] = leaked_slots(core.scheduler)     # the end-of-run check of both modes
    if hasattr(cost_model, "summary"):           # e.g. the profiled model's fallback count
        summary["costmodel"] = cost_model.summary()
    write_run(out_dir or cfg.output_dir, requests, steps, summary)
    if cfg.print_summary:
        print(format_summary(summary))
    return summary
