"""The one way to build a model runner from a composed config (mode=real, mode=serve, the offline
Engine and the benches): device, dtype, weights, fast path, CUDA graphs for every decode batch the
scheduler may run, warm-up. Imports torch."""
from __future__ import annotations

import time

from omegaconf import DictConfig

from runtime.build import CoreComponents, graph_max_batch_size, piecewise_graph_tokens  # noqa: F401 (re-exported)
from runtime.distributed.sharding import SINGLE, ModelParallel
from runtime.engine.fast_path import FastPathConfig
from runtime.engine.model_runner import ModelRunner, resolve_device

CPU_POOL_LIMIT_BYTES = 8 * 2**30


def load_format(cfg: DictConfig, path: str | None) -> str:
    if cfg.real.load_format != "auto":
        return cfg.real.load_format
    return "safetensors" if path else "dummy"


def moe_kernel_token_counts(model, max_tokens: int) -> list[int]:
    """Step sizes (tokens) that between them use every fused-MoE launch config the model's MoE layers can
    pick for up to max_tokens tokens; [] without MoE layers. A config first met while serving compiles its
    Triton kernels inside that step (~0.5 s on an H200): warm-up runs each of these sizes once instead."""
    from kernels.fused_moe.config import config_token_counts, dtype_name
    from runtime.models.moe import MoE

    moe = next((m for m in model.modules() if isinstance(m, MoE)), None)
    if moe is None:
        return []
    w13 = moe.experts.w13                                   # [E_local (+ stacked shared), 2I, H]
    return config_token_counts(moe.experts.num_local, moe.gate.config.num_experts_per_tok, w13.shape[1] // 2,
                               dtype_name(w13.dtype), max_tokens)


def build_model_runner(cfg: DictConfig, core: CoreComponents, warmup: bool | None = None,
                       parallel: ModelParallel = SINGLE, device: str | None = None) -> ModelRunner:
    """A ModelRunner for `core` (its KV capacity, scheduler limits) as `cfg.real` asks; on CUDA it
    also warms up the JIT kernels (`real.warmup`) and reports `runner.warmup_s`. A rank of a
    multi-process run passes its shard (`parallel`) and its own device (`cuda:<local rank>`); every
    rank of a TP group builds, captures and warms up the same way (the collectives pair up)."""
    if parallel.tp_size != core.layout.tp:
        raise ValueError(f"tp={core.layout.tp} needs one process per GPU: it runs in mode=real "
                         "(runtime/distributed); this entry point builds a single-process runner")
    device = resolve_device(device or cfg.real.device)
    pool_bytes = core.kv_capacity_tokens * core.model.kv_bytes_per_token(int(cfg.kv.dtype_bytes))
    if device.type == "cpu" and pool_bytes > CPU_POOL_LIMIT_BYTES:
        raise ValueError(f"a KV pool of {core.kv_capacity_tokens} tokens ({pool_bytes / 2**30:.1f} GiB) "
                         f"is sized for hardware={core.hardware.name}; on CPU use hardware=cpu or set "
                         "kv.capacity_tokens")
    config = core.scheduler.config
    piecewise_tokens = piecewise_graph_tokens(cfg)         # 0: none (off, no graphs, DP attention), as mode=sim reads it
    fast = FastPathConfig(enabled=bool(cfg.real.fast_path), cuda_graph=bool(cfg.real.cuda_graph),
                          layer_fusions=bool(cfg.real.layer_fusions),
                          cuda_graph_max_bs=graph_max_batch_size(cfg), progress=bool(cfg.progress),
                          piecewise_cuda_graph=piecewise_tokens > 0, piecewise_max_tokens=max(1, piecewise_tokens))
    runner = ModelRunner(dict(core.model.hf_config), core.kv_capacity_tokens, device=str(device),
                         dtype=cfg.real.dtype, load_format=load_format(cfg, core.model.path),
                         path=core.model.path, seed=int(cfg.seed), fast=fast,
                         max_running_requests=config.max_running_requests,
                         max_context_tokens=core.model.max_context_tokens, parallel=parallel)
    runner.warmup_s = 0.0
    if (cfg.real.warmup if warmup is None else warmup) and device.type == "cuda":
        chunk = int(cfg.scheduler.chunked_prefill_size)
        started = time.perf_counter()
        longest = chunk if chunk > 0 else 8192
        runner.warmup(sorted({longest, 2048, 512, 64, *moe_kernel_token_counts(runner.model, longest)}, reverse=True))
        runner.warmup_s = time.perf_counter() - started
    return runner
