"""The pipeline every single-replica mode repeats: build the core, load and check the workload, build
the cost model, run the mode's driver, then the end-of-run checks, the summary and the records.
Imports neither torch nor simpy: a mode brings its executor and driver through `make_run`.
"""
from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol, Sequence

import pandas as pd
from hydra.utils import instantiate
from omegaconf import DictConfig

from runtime.build import CoreComponents, build_core, check_workload_fits, describe
from runtime.core.records import StepLog
from runtime.core.request import Request, RequestSpec
from runtime.metrics import format_summary, summarize
from runtime.records_io import requests_frame, steps_frame, write_run
from runtime.run_checks import end_of_run_checks
from sim.costmodel.base import CostModel
from sim.predictor import build_cost_model


class Outcome(Protocol):
    requests: list[Request]     # every request of the run, finished or aborted
    steps: StepLog


class Driver(Protocol):
    """A loop over one scheduler and an Executor (runtime.driver.RealDriver, sim.driver.SimDriver)."""

    def run(self, specs: Sequence[RequestSpec]) -> Outcome: ...


@dataclass
class ModeRun:
    """What a mode hands `run_mode` once the core and the cost model exist: its summary's `mode`,
    the driver (around the mode's executor and `core.scheduler`), the summary fields only this mode
    has (a function of the steps frame, called after the run), a context the run goes inside, and
    what it writes into the run directory besides the records (called with it after them)."""

    mode: str
    driver: Driver
    summary_fields: Callable[[pd.DataFrame], dict] = field(default=lambda steps: {})
    context: Callable[[], AbstractContextManager] = nullcontext
    write_extra: Callable[[Path], None] = field(default=lambda run_dir: None)


MakeRun = Callable[[DictConfig, CoreComponents, CostModel], ModeRun]


def run_mode(cfg: DictConfig, make_run: MakeRun, out_dir: str | Path | None = None) -> dict:
    """Serve `cfg.workload` through the driver `make_run(cfg, core, cost_model)` builds; write
    requests.parquet, steps.parquet and summary.json into `out_dir` (default: the Hydra run
    directory) and return the summary. Raises if the run stalled (work left in the scheduler, a
    request lost); reports leaked KV slots in the summary."""
    wall_start = time.perf_counter()
    core = build_core(cfg)
    specs = instantiate(cfg.workload).requests()
    check_workload_fits(core, specs)
    if cfg.print_summary:
        print(describe(core))
    cost_model = build_cost_model(cfg, core)
    run = make_run(cfg, core, cost_model)
    with run.context():
        outcome = run.driver.run(specs)
    checks = end_of_run_checks([core.scheduler], outcome.requests, len(specs))
    requests, steps = requests_frame(outcome.requests), steps_frame(outcome.steps)
    summary = summarize(requests, steps, mode=run.mode, wall_time_s=time.perf_counter() - wall_start)
    summary["kv_capacity_tokens"] = core.kv_capacity_tokens
    summary.update(run.summary_fields(steps))
    summary.update(checks)
    add_costmodel_summary(summary, cost_model)
    run.write_extra(publish(cfg, out_dir, requests, steps, summary))
    return summary


def add_costmodel_summary(summary: dict, cost_model: CostModel | None) -> None:
    """The predicting model's own account under `costmodel` (e.g. the profiled model's fallbacks)."""
    if hasattr(cost_model, "summary"):
        summary["costmodel"] = cost_model.summary()


def publish(cfg: DictConfig, out_dir: str | Path | None, requests: pd.DataFrame, steps: pd.DataFrame,
            summary: dict, note: str | None = None) -> Path:
    """Write the run's records into `out_dir` (default `cfg.output_dir`) and, with `print_summary`,
    print the summary table (and `note`, a mode's own line)."""
    out = write_run(out_dir or cfg.output_dir, requests, steps, summary)
    if cfg.print_summary:
        print(format_summary(summary))
        if note:
            print(note)
    return out
