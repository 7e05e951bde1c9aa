"""Builds the shared serving components from a composed Hydra config: model/hardware specs,
layout, KV capacity, allocator, radix cache, policy, scheduler -- once, or once per DP replica.
Used by every mode.

Torch-free: the simulator imports it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from runtime.core.cache.allocator import KVSlotAllocator
from runtime.core.cache.counting_allocator import CountingSlotAllocator, SlotAllocator
from runtime.core.cache.radix_cache import RadixCache
from runtime.core.hardware import HardwareSpec
from runtime.core.kv_manager import KVManager
from runtime.core.layout import ParallelLayout, kv_capacity_tokens
from runtime.core.graph_grids import PIECEWISE_DEFAULT_MAX_TOKENS, capture_batch_sizes
from runtime.core.memory_budget import check_fits, runtime_memory
from runtime.core.model_spec import ModelSpec
from runtime.core.scheduler import Scheduler
from runtime.core.scheduler_config import SchedulerConfig


@dataclass
class CoreComponents:
    model: ModelSpec
    hardware: HardwareSpec
    layout: ParallelLayout
    kv_capacity_tokens: int
    scheduler: Scheduler


def build_layout(cfg: DictConfig) -> ParallelLayout:
    return ParallelLayout(tp=int(cfg.tp), ep=int(cfg.ep), dp=int(cfg.dp), pp=int(cfg.pp),
                          dp_attention=bool(cfg.get("dp_attention", False)))


def kv_capacity_from_config(cfg: DictConfig, model: ModelSpec, hardware: HardwareSpec,
                            layout: ParallelLayout) -> int:
    """`kv.capacity_tokens` when set (experiments on small pools), else THE capacity function."""
    if cfg.kv.capacity_tokens is not None:
        return int(cfg.kv.capacity_tokens)
    fraction = float(cfg.kv.mem_fraction_static)
    memory = runtime_memory(model, layout, scheduler_config(cfg), graph_pool_tokens=piecewise_graph_tokens(cfg))
    check_fits(memory, hardware, fraction)
    return kv_capacity_tokens(model, hardware, layout, kv_dtype_bytes=int(cfg.kv.dtype_bytes),
                              mem_fraction_static=fraction, activation_reserve_bytes=memory.slot_table_bytes)


def dp_attention_active(layout: ParallelLayout) -> bool:
    """DP attention with more than one attention rank (dp=1 with dp_attention is plain tp)."""
    return layout.dp_attention and layout.dp > 1


def graph_max_batch_size(cfg: DictConfig) -> int:
    """`real.cuda_graph_max_bs`, or (null) every decode batch the scheduler may run."""
    value = cfg.real.get("cuda_graph_max_bs")
    return int(value) if value is not None else int(cfg.scheduler.max_running_requests)


def decode_graph_batch_sizes(cfg: DictConfig) -> list[int]:
    """The decode batch sizes mode=real captures as CUDA graphs on a GPU, ascending ([]: none, with
    `real.cuda_graph` or `real.fast_path` off), as runtime/engine/build_runner.py asks the runner for
    them. Under DP attention every rank of a step replays one of them, chosen by
    runtime.dp_attention_graphs; the simulator prices the step with the same sizes and rule."""
    real = cfg.get("real")
    if real is None or not (real.get("fast_path") and real.get("cuda_graph")):
        return []
    return capture_batch_sizes(graph_max_batch_size(cfg))


def piecewise_graph_tokens(cfg: DictConfig) -> int:
    """New tokens of the largest step the real runtime captures as piecewise CUDA graphs (0: none), as
    runtime/engine/build_runner.py decides it: `real.piecewise_cuda_graph_max_tokens`, or (null)
    PIECEWISE_DEFAULT_MAX_TOKENS capped by the prefill chunk. Under tp > 1 every GPU of the group captures
    the same counts (the pieces hold the all-reduces); DP attention captures none."""
    real = cfg.get("real")
    if real is None or not (real.get("fast_path") and real.get("cuda_graph") and real.get("piecewise_cuda_graph")):
        return 0
    if cfg.get("dp_attention", False) and int(cfg.get("dp", 1)) > 1:
        return 0          # DP attention: ranks extend different token counts; its prefill rounds run eagerly
    if real.get("piecewise_cuda_graph_max_tokens") is not None:
        return int(real.piecewise_cuda_graph_max_tokens)
    chunk = int(cfg.scheduler.chunked_prefill_size)
    return min(PIECEWISE_DEFAULT_MAX_TOKENS, chunk if chunk > 0 else int(cfg.scheduler.max_prefill_tokens))


def scheduler_config(cfg: DictConfig) -> SchedulerConfig:
    """`cfg.scheduler`; with dp_attention each attention rank's, adjusted as SGLang's server args
    do for --enable-dp-attention: chunked_prefill_size // dp and schedule_conservativeness x 0.3
    (which scales the reserved new-token ratio)."""
    config = SchedulerConfig(**OmegaConf.to_container(cfg.scheduler, resolve=True))
    dp = int(cfg.dp)
    if not cfg.get("dp_attention", False) or dp == 1:
        return config
    chunk = config.chunked_prefill_size
    return replace(config, chunked_prefill_size=max(1, chunk // dp) if chunk > 0 else chunk,
                   init_new_token_ratio=min(1.0, config.init_new_token_ratio * 0.3))


SLOT_ALLOCATORS = ("auto", "paged", "counting")


def slot_allocator_kind(cfg: DictConfig) -> str:
    """`kv.slot_allocator` resolved: "paged" or "counting". `auto` is counting where the slots
    address nothing -- a simulating mode (`mode` from the `sim` package) -- and paged otherwise (the
    real runtime indexes its KV tensors with the slots)."""
    kind = str(cfg.kv.get("slot_allocator", "auto"))
    if kind not in SLOT_ALLOCATORS:
        raise ValueError(f"kv.slot_allocator must be one of {SLOT_ALLOCATORS}, got {kind!r}")
    if kind != "auto":
        return kind
    mode = cfg.get("mode")
    target = str(mode.get("_target_", "")) if mode is not None else ""
    return "counting" if target.startswith("sim.") else "paged"


def build_allocator(cfg: DictConfig, capacity_tokens: int) -> SlotAllocator:
    """The KV slot allocator of one scheduler (`slot_allocator_kind`)."""
    page_size = int(cfg.cache.page_size)
    if slot_allocator_kind(cfg) == "counting":
        return CountingSlotAllocator(capacity_tokens, page_size=page_size)
    return KVSlotAllocator(capacity_tokens, page_size=page_size,
                           check_double_free=bool(cfg.kv.get("check_double_free", True)))


def build_scheduler(cfg: DictConfig, model: ModelSpec, capacity_tokens: int) -> Scheduler:
    page_size = int(cfg.cache.page_size)
    allocator = build_allocator(cfg, capacity_tokens)
    cache = RadixCache(allocator, instantiate(cfg.eviction), page_size=page_size, enabled=bool(cfg.cache.enabled))
    config = scheduler_config(cfg)
    policy = instantiate(cfg.policy)
    return Scheduler(config, policy, KVManager(allocator, cache), max_context_tokens=model.max_context_tokens)


def build_core(cfg: DictConfig) -> CoreComponents:
    model: ModelSpec = instantiate(cfg.model)
    hardware: HardwareSpec = instantiate(cfg.hardware)
    layout = build_layout(cfg)
    layout.validate(model)
    capacity = kv_capacity_from_config(cfg, model, hardware, layout)
    return CoreComponents(model, hardware, layout, capacity, build_scheduler(cfg, model, capacity))


def build_replica_cores(cfg: DictConfig) -> list[CoreComponents]:
    """One core per DP replica (with dp_attention: per attention rank), `layout.dp` in all. They
    share the model, hardware, layout and KV capacity (THE capacity function gives it per
    replica); each has its own scheduler, policy, radix cache and KV slot allocator."""
    first = build_core(cfg)
    rest = [replace(first, scheduler=build_scheduler(cfg, first.model, first.kv_capacity_tokens))
            for _ in range(first.layout.dp - 1)]
    return [first, *rest]


def describe(core: CoreComponents) -> str:
    """One line a run prints before it starts: the layout and KV capacity it chose."""
    lay = core.layout
    extra = " dp_attention" if lay.dp_attention else ""
    return (f"{core.model.name} on {core.hardware.name}: tp={lay.tp} ep={lay.ep} dp={lay.dp} pp={lay.pp}{extra}, "
            f"KV capacity {core.kv_capacity_tokens:,} tokens per replica")


def check_workload_fits(core: CoreComponents, specs) -> None:
    """Fail before any work when no request of the workload can ever run (every prompt longer than
    the KV pool or the model's context): such a run would only abort requests."""
    if not specs:
        raise ValueError("the workload has no requests")
    shortest = min(len(s.input_ids) for s in specs)
    limit = min(core.kv_capacity_tokens, core.model.max_context_tokens)
    if shortest + 1 > limit:
        raise ValueError(f"no request can run: the shortest prompt has {shortest} tokens but the KV pool holds "
                         f"{core.kv_capacity_tokens} (kv.capacity_tokens) and the context {core.model.max_context_tokens}; "
                         "raise kv.capacity_tokens or shorten the workload's prompts")


def leaked_slots(scheduler) -> int:
    """Slots neither free nor held by the radix cache once every request has ended (must be 0)."""
    alloc, cache = scheduler.kv.allocator, scheduler.kv.cache
    return alloc.capacity_slots - alloc.num_free_slots - cache.total_size()
