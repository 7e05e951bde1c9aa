"""`mode=sim` with dp > 1 or dp_attention: build one core per replica (or attention rank), the
router and the cost model, simulate, and write the usual records of all replicas merged, with a
`replica` column. Torch-free.
"""
from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
from hydra.utils import instantiate
from omegaconf import DictConfig

from runtime.build import CoreComponents, build_replica_cores, check_workload_fits, describe
from runtime.metrics import summarize
from runtime.records_io import requests_frame, steps_frame
from runtime.run_checks import end_of_run_checks
from runtime.run_mode import add_costmodel_summary, publish
from sim.dp_driver import DPAttentionSimDriver, DPOutcome, DPSimDriver
from sim.driver import SimDriver
from sim.executor import SimExecutor
from sim.predictor import build_cost_model, dp_attention_cost_model


def merged_frames(outcome: DPOutcome) -> tuple[pd.DataFrame, pd.DataFrame]:
    """requests (by arrival, then rid) and steps (by start, then replica, then step) of all
    replicas, each row with the replica that served it."""
    requests = pd.concat([requests_frame(reqs).assign(replica=r) for r, reqs in enumerate(outcome.requests)],
                         ignore_index=True)
    steps = pd.concat([steps_frame(log).assign(replica=r) for r, log in enumerate(outcome.steps)],
                      ignore_index=True)
    requests = requests.sort_values(["arrival_s", "rid"], kind="mergesort").reset_index(drop=True)
    steps = steps.sort_values(["start_s", "replica", "step_id"], kind="mergesort").reset_index(drop=True)
    return requests, steps


def _driver(cfg: DictConfig, cores: list[CoreComponents], router, progress: bool):
    first = cores[0]
    if first.layout.dp_attention:
        cost_model = dp_attention_cost_model(cfg, first)
        executor = SimExecutor(cost_model.attention, vocab_size=first.model.vocab_size)
        return DPAttentionSimDriver([c.scheduler for c in cores], executor, cost_model, router, progress)
    cost_model = build_cost_model(cfg, first)
    executor = SimExecutor(cost_model, vocab_size=first.model.vocab_size)   # stateless: shared
    drivers = [SimDriver(c.scheduler, executor, fast_forward=bool(cfg.sim.fast_forward),
                         max_run_steps=int(cfg.sim.max_run_steps), progress=False,
                         overlap=bool(cfg.get("overlap", False))) for c in cores]
    return DPSimDriver(drivers, router, progress)


def run_sim_dp(cfg: DictConfig, out_dir: str | Path | None = None) -> dict:
    """Simulate `cfg.workload` over layout.dp replicas behind `cfg.router`; write the records
    into `out_dir` (default: the Hydra run directory). Returns the summary (over all replicas)."""
    wall_start = time.perf_counter()
    cores = build_replica_cores(cfg)
    router = instantiate(cfg.router)(num_replicas=len(cores))
    specs = instantiate(cfg.workload).requests()
    check_workload_fits(cores[0], specs)
    if cfg.print_summary:
        print(describe(cores[0]))
    driver = _driver(cfg, cores, router, bool(cfg.progress))
    outcome = driver.run(specs)
    checks = end_of_run_checks([c.scheduler for c in cores], [r for reqs in outcome.requests for r in reqs],
                               len(specs))
    requests, steps = merged_frames(outcome)
    summary = summarize(requests, steps, mode="sim", wall_time_s=time.perf_counter() - wall_start)
    layout = cores[0].layout
    summary["kv_capacity_tokens"] = cores[0].kv_capacity_tokens      # per replica / attention rank
    summary["dp"] = {
        "replicas": layout.dp, "dp_attention": layout.dp_attention, "num_gpus": layout.num_gpus,
        "router": type(router).__name__,
        "requests_per_replica": requests.groupby("replica").size().reindex(range(layout.dp), fill_value=0).tolist(),
        "steps_per_replica": steps.groupby("replica").size().reindex(range(layout.dp), fill_value=0).tolist(),
    }
    summary.update(checks)                               # leaked KV slots, all replicas together
    replicas = getattr(driver, "drivers", None)          # one executor (and cost model) shared by all
    add_costmodel_summary(summary, replicas[0].executor.cost_model if replicas else None)
    publish(cfg, out_dir, requests, steps, summary,
            note=f"dp={layout.dp}{' (dp attention)' if layout.dp_attention else ''} router={summary['dp']['router']}  "
                 f"requests per replica {summary['dp']['requests_per_replica']}")
    return summary
