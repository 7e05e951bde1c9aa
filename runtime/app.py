"""`mode=real`: the same scheduler and policies driving a torch model on the wall clock; writes
the same records as `mode=sim`. Imports torch (only through the model runner)."""
from __future__ import annotations

import time
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig

from runtime.build import build_core, check_workload_fits, describe, leaked_slots
from runtime.driver import RealDriver
from runtime.metrics import format_summary, step_prediction_error, summarize
from runtime.records_io import requests_frame, steps_frame, write_run
from sim.predictor import build_cost_model, step_predictor


def run_real(cfg: DictConfig, out_dir: str | Path | None = None) -> dict:
    """Serve `cfg.workload` with the real model and write requests.parquet, steps.parquet and
    summary.json (same schema as the simulator). Returns the summary."""
    from runtime.engine.build_runner import build_model_runner   # torch only here

    wall_start = time.perf_counter()
    core = build_core(cfg)
    if core.layout.num_gpus != 1 or int(cfg.get("nnodes", 1)) > 1:   # one process per GPU (runtime/distributed)
        from runtime.distributed.app import run_real_distributed
        return run_real_distributed(cfg, out_dir)
    runner = build_model_runner(cfg, core)
    device, warmup_s = runner.device, runner.warmup_s
    specs = instantiate(cfg.workload).requests()
    check_workload_fits(core, specs)
    if cfg.print_summary:
        print(describe(core))
    cost_model = build_cost_model(cfg, core)
    predict = step_predictor(cost_model, overlap=bool(cfg.overlap))
    driver = RealDriver(core.scheduler, runner, as_fast_as_possible=bool(cfg.real.as_fast_as_possible),
                        progress=bool(cfg.progress), overlap=bool(cfg.overlap), predict=predict)
    outcome = driver.run(specs)
    requests, steps = requests_frame(outcome.requests), steps_frame(outcome.steps)
    summary = summarize(requests, steps, mode="real", wall_time_s=time.perf_counter() - wall_start)
    summary.update(kv_capacity_tokens=core.kv_capacity_tokens, load_time_s=runner.load_time_s, warmup_s=warmup_s,
                   device=str(device), leaked_kv_slots=leaked_slots(core.scheduler),
                   step_prediction_error=step_prediction_error(steps))
    if hasattr(cost_model, "summary"):           # the predicting model's own account (profiled: fallbacks)
        summary["costmodel"] = cost_model.summary()
    write_run(out_dir or cfg.output_dir, requests, steps, summary)
    if cfg.print_summary:
        print(format_summary(summary))
    return summary
