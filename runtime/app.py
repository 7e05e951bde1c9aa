"""`mode=real`: the same scheduler and policies driving a torch model on the wall clock; writes
the same records as `mode=sim`. Imports torch (only through the model runner)."""
from __future__ import annotations

import time
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig

from runtime.build import build_core
from runtime.driver import RealDriver
from runtime.metrics import format_summary, summarize
from runtime.records_io import requests_frame, steps_frame, write_run

CPU_POOL_LIMIT_BYTES = 8 * 2**30


def run_real(cfg: DictConfig, out_dir: str | Path | None = None) -> dict:
    """Serve `cfg.workload` with the real model and write requests.parquet, steps.parquet and
    summary.json (same schema as the simulator). Returns the summary."""
    from runtime.engine.fast_path import FastPathConfig
    from runtime.engine.model_runner import ModelRunner, resolve_device   # torch only here

    wall_start = time.perf_counter()
    core = build_core(cfg)
    if core.layout.num_gpus != 1:
        raise ValueError("mode=real runs one GPU for now (tp=ep=dp=pp=1); multi-GPU layouts are the "
                         "parallel-layout issue's work")
    device = resolve_device(cfg.real.device)
    pool_bytes = core.kv_capacity_tokens * core.model.kv_bytes_per_token(int(cfg.kv.dtype_bytes))
    if device.type == "cpu" and pool_bytes > CPU_POOL_LIMIT_BYTES:
        raise ValueError(f"a KV pool of {core.kv_capacity_tokens} tokens ({pool_bytes / 2**30:.1f} GiB) "
                         f"is sized for hardware={core.hardware.name}; on CPU use hardware=cpu or set "
                         "kv.capacity_tokens")
    runner = ModelRunner(dict(core.model.hf_config), core.kv_capacity_tokens, device=str(device),
                         dtype=cfg.real.dtype, load_format=load_format(cfg, core.model.path),
                         path=core.model.path,
                         seed=int(cfg.seed),
                         fast=FastPathConfig(enabled=bool(cfg.real.fast_path), cuda_graph=bool(cfg.real.cuda_graph),
                                             cuda_graph_max_bs=int(cfg.real.cuda_graph_max_bs),
                                             progress=bool(cfg.progress)))
    warmup_s = 0.0
    if cfg.real.warmup and device.type == "cuda":   # compile JIT kernels before the clock starts
        chunk = int(cfg.scheduler.chunked_prefill_size)
        warmup_s = runner.warmup(sorted({chunk if chunk > 0 else 8192, 2048, 512, 64}, reverse=True))
    specs = instantiate(cfg.workload).requests()
    driver = RealDriver(core.scheduler, runner.execute, as_fast_as_possible=bool(cfg.real.as_fast_as_possible),
                        progress=bool(cfg.progress))
    outcome = driver.run(specs)
    requests, steps = requests_frame(outcome.requests), steps_frame(outcome.steps)
    summary = summarize(requests, steps, mode="real", wall_time_s=time.perf_counter() - wall_start)
    summary.update(kv_capacity_tokens=core.kv_capacity_tokens, load_time_s=runner.load_time_s, warmup_s=warmup_s,
                   device=str(device), leaked_kv_slots=leaked_slots(core.scheduler))
    write_run(out_dir or cfg.output_dir, requests, steps, summary)
    if cfg.print_summary:
        print(format_summary(summary))
    return summary


def load_format(cfg: DictConfig, path: str | None) -> str:
    if cfg.real.load_format != "auto":
        return cfg.real.load_format
    return "safetensors" if path else "dummy"


def leaked_slots(scheduler) -> int:
    """Slots neither free nor held by the radix cache once every request has ended (must be 0)."""
    alloc, cache = scheduler.kv.allocator, scheduler.kv.cache
    return alloc.capacity_slots - alloc.num_free_slots - cache.total_size()
