"""`mode=real`: the same scheduler and policies driving a torch model on the wall clock; writes
the same records as `mode=sim` (runtime/run_mode.py). Imports torch (only through the model runner)."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from runtime.build import CoreComponents, build_layout
from runtime.build import leaked_slots  # noqa: F401  (callers import it from here)
from runtime.driver import RealDriver
from runtime.gc_pauses import GCPauses, serving_gc
from runtime.metrics import step_prediction_error
from runtime.run_mode import ModeRun, run_mode
from sim.costmodel.base import CostModel
from sim.predictor import step_predictor
from sim.step_shapes import shapes_frame, write_step_shapes


def real_run(cfg: DictConfig, core: CoreComponents, cost_model: CostModel) -> ModeRun:
    """The model runner (the Executor) behind the real-time driver; every step also records the
    simulator's prediction, and its shape (step_shapes.parquet, to score other cost models on it later). Summary fields of this mode: load and warm-up times, the device, the
    step prediction error and the garbage collections while serving (start-up objects frozen: real.freeze_gc)."""
    from runtime.engine.build_runner import build_model_runner   # torch only here

    runner = build_model_runner(cfg, core)
    pauses = GCPauses(float(cfg.real.gc_warning_threshold_s))
    shapes: list[dict] = []
    driver = RealDriver(core.scheduler, runner, as_fast_as_possible=bool(cfg.real.as_fast_as_possible),
                        progress=bool(cfg.progress), overlap=bool(cfg.overlap),
                        predict=step_predictor(cost_model, overlap=bool(cfg.overlap), shapes=shapes))

    def fields(steps) -> dict:
        return dict(load_time_s=runner.load_time_s, warmup_s=runner.warmup_s, device=str(runner.device),
                    step_prediction_error=step_prediction_error(steps), gc=pauses.summary())
    return ModeRun("real", driver, fields, context=lambda: serving_gc(pauses, bool(cfg.real.freeze_gc)),
                   write_extra=lambda run_dir: write_step_shapes(run_dir, shapes_frame(shapes)))


def run_real(cfg: DictConfig, out_dir: str | Path | None = None) -> dict:
    """Serve `cfg.workload` with the real model and write requests.parquet, steps.parquet and
    summary.json (same schema as the simulator). Returns the summary."""
    if build_layout(cfg).num_gpus != 1 or int(cfg.get("nnodes", 1)) > 1:   # one process per GPU
        from runtime.distributed.app import run_real_distributed
        return run_real_distributed(cfg, out_dir)
    return run_mode(cfg, real_run, out_dir)
