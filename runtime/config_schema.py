"""Structured-config schemas (Hydra ConfigStore): a misspelled or mistyped key fails at
composition. Group options (model, policy, ...) are validated by Hydra, which lists the valid ones.

Torch-free.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from runtime.core.scheduler_config import SchedulerConfig


def _mutable_copy(cls: type, name: str) -> type:
    """A plain (non-frozen) dataclass with the fields, types and defaults of `cls`, for OmegaConf."""
    hints = typing.get_type_hints(cls)
    fields = [(f.name, hints[f.name], field(default=f.default)) for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(name, fields)


SchedulerSchema = _mutable_copy(SchedulerConfig, "SchedulerSchema")


@dataclass
class CacheSchema:
    enabled: bool = True          # false: every request misses (baselines)
    page_size: int = 1            # tokens per KV page; the radix cache matches whole pages


@dataclass
class KVSchema:
    dtype_bytes: int = 2                   # 2 = bf16 KV cache, 1 = fp8
    mem_fraction_static: float = 0.88      # share of GPU memory for weights + KV pool (SGLang)
    capacity_tokens: Optional[int] = None  # override THE capacity function (small-pool experiments)
    check_double_free: bool = True         # false: the slot allocator skips its double-free checks (faster sim)
    slot_allocator: str = "auto"           # paged | counting (free-page count only, no slot identities) | auto:
                                           # counting in mode=sim (slots address nothing there), paged otherwise


@dataclass
class SimSchema:
    fast_forward: bool = True     # coalesce uneventful decode steps (exact; records unchanged)
    max_run_steps: int = 1024     # longest coalesced run


@dataclass
class RealSchema:
    device: str = "auto"                 # auto = cuda when available, else cpu
    dtype: str = "bfloat16"              # bfloat16 | float16 | float32
    load_format: str = "auto"            # auto: safetensors when model.path is set, else dummy
    as_fast_as_possible: bool = False    # every request arrives at t=0 instead of its timestamp
    warmup: bool = True                  # on CUDA: throw-away prefills first, so JIT kernels compile before serving
    fast_path: bool = True               # CUDA only: FlashInfer/Triton MLA + Triton fused MoE
    layer_fusions: bool = True           # CUDA fast path: shared experts stacked into the fused MoE (one GPU),
                                         # steps of up to 512 tokens routed by one Triton kernel pair, MLA input projections in one GEMM
    cuda_graph: bool = True              # CUDA only, needs fast_path and an MLA model: decode graphs
    cuda_graph_max_bs: Optional[int] = None   # largest captured decode batch; null = scheduler.max_running_requests
    piecewise_cuda_graph: bool = True    # CUDA, fast path, one GPU: extend/mixed steps replay per-layer graph pieces
    piecewise_cuda_graph_max_tokens: Optional[int] = None   # largest captured step; null = 8192 (capped by the chunk)
    nccl_graph_mixing: bool = False      # tp > 1: NCCL_GRAPH_MIXING_SUPPORT in every rank. NCCL's default (true) fences each
                                         # captured collective for graphs running beside other NCCL work, and the attention
                                         # cores launched between piecewise graph pieces then wait for the device; a rank runs
                                         # its collectives on one stream, one at a time, so false loses nothing
                                         # (experiments/results/h200x2/tp_launch_probe)
    dist_timeout_s: float = 600.0        # tp/dp > 1: a collective waiting longer fails (a peer hung); idle leaders ping
    freeze_gc: bool = True               # once the runner is built and warm: gc.freeze(), so collections while serving
                                         # skip the start-up objects (SGLang's /freeze_gc, which it leaves to the user)
    gc_warning_threshold_s: float = 0.05   # a garbage collection longer than this is logged (SGLang's
                                           # --gc-warning-threshold-secs); 0 = never; summaries count them all


@dataclass
class ServerSchema:
    host: str = "127.0.0.1"                    # mode=serve: address the HTTP server binds
    port: int = 30000
    served_model_name: Optional[str] = None    # the `model` name clients send; null = model.name
    startup_timeout_s: float = 1800.0          # wait for the scheduler process (weights, CUDA graphs)
    graceful_shutdown_s: float = 5.0           # on SIGINT/SIGTERM, in-flight requests may finish this long
    stream_interval: int = 1                   # SGLang's --stream-interval: a request's outputs go out every N tokens
                                               # (its first token and its finish at once); larger = fewer writes
    tokenizer_workers: int = 1                 # SGLang's --tokenizer-worker-num: HTTP + tokenizer processes sharing
                                               # the port (1: HTTP in the launcher's process, as before)
    detokenizer: str = "process"               # process: a detokenizer process turns token ids into text | inline:
                                               # none, the scheduler sends token ids to the HTTP workers, which decode
    first_outputs_direct: bool = True          # with detokenizer=process: requests' first outputs also go straight
                                               # to their HTTP worker, which decodes them (a hop less to first token)
    warmup: bool = True                        # one streamed request through each HTTP worker before it accepts
                                               # clients, then a cache flush (SGLang's server warm-up; false is its
                                               # --skip-server-warmup)
    busy_poll_s: Optional[float] = None        # a receiving process (detokenizer, HTTP workers, an idle scheduler)
                                               # spins this long after its last message instead of sleeping (a
                                               # wake-up costs 0.1-0.3 ms per hop); null = 0.1 s on machines of
                                               # >= 8 cores, else 0 (each spinning process takes a core)


@dataclass
class ProfileSchema:
    grid: str = "quick"                  # mode=profile: smoke (CPU tests) | quick (its sections, run separately,
                                         # summed to 20-25 min on one H200) | full
    out_dir: Optional[str] = None        # null = sim/profiles/<hardware>/<model>
    sections: Optional[str] = None       # comma-separated subset of decode,prefill,host,mixed,ops,decode_shared; null = all
    resume: bool = True                  # skip grid points already in the tables
    kv_fill: str = "model"               # the KV pool before timing: model = written by prefills of synthetic
                                         # tokens (as served KV is); zeros = as allocated


@dataclass
class TokenizerSchema:
    path: Optional[str] = None           # a local Hugging Face tokenizer dir; null = built-in byte tokenizer


@dataclass
class RunConfig:
    mode: Any = MISSING
    model: Any = MISSING
    hardware: Any = MISSING
    policy: Any = MISSING
    eviction: Any = MISSING
    workload: Any = MISSING
    costmodel: Any = MISSING
    router: Any = MISSING
    real: RealSchema = field(default_factory=RealSchema)
    tokenizer: TokenizerSchema = field(default_factory=TokenizerSchema)
    server: ServerSchema = field(default_factory=ServerSchema)
    profile: ProfileSchema = field(default_factory=ProfileSchema)
    scheduler: Any = field(default_factory=SchedulerSchema)
    cache: CacheSchema = field(default_factory=CacheSchema)
    kv: KVSchema = field(default_factory=KVSchema)
    sim: SimSchema = field(default_factory=SimSchema)
    seed: int = 0
    overlap: bool = True          # overlap scheduling (plan step n+1 while step n runs); both modes
    tp: int = 1
    ep: int = 1
    dp: int = 1
    pp: int = 1
    dp_attention: bool = False    # SGLang --enable-dp-attention (dp attention ranks inside tp)
    nnodes: int = 1               # mode=real over several machines: each runs its share of the tp * dp ranks
    node_rank: int = 0
    dist_init_addr: Optional[str] = None   # HOST:PORT of node 0's rendezvous (needed when nnodes > 1)
    progress: bool = True
    print_summary: bool = True
    output_dir: str = "${hydra:runtime.output_dir}"


def register_schemas() -> None:
    ConfigStore.instance().store(name="run_schema", node=RunConfig)
