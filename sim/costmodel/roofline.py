"""Roofline cost model: each operator costs max(FLOPs / achieved FLOP/s, bytes / achieved B/s).

numpy (yaml for a fit file); no torch, no simpy, no clock. Operators follow SGLang's kernels for one DP
replica (every GPU of a TP group does the same work in parallel, so per-GPU time is step time);
pipeline stages run one after another (no micro-batch overlap).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Sequence

import numpy as np
import yaml

from runtime.core.graph_grids import extend_token_buckets, padded_size
from runtime.core.hardware import HardwareSpec
from runtime.core.layout import ParallelLayout
from runtime.core.model_spec import ModelSpec
from sim.costmodel.base import StepShape, decode_segments_one_by_one
from sim.costmodel.collective_table import build_collectives
from sim.costmodel.profile_tables import PROFILES_DIR
from sim.costmodel.roofline_ops import (
    GPU_OPS, PIECEWISE_EAGER_KERNELS_PER_LAYER, FixedTerms, LayerCoefficients, price_fixed_terms,
)

# Breakdown keys, in summation order: GPU work, then `launch` (host launch time the GPU does
# not hide) and `cpu_overhead` (the scheduler's per-step work).
OPS = GPU_OPS + ("launch", "cpu_overhead")
FIT_FILE = "roofline_fit.yaml"   # sim/profiles/<hardware>/, written by experiments/fit_roofline.py
MAX_MBU = 1.5   # bandwidth efficiencies: a read-mostly kernel can pass the copy rate (read + write)


class RooflineCostModel:
    """Prices a StepShape from model sizes and hardware rates; see roofline_ops for operators.

    Efficiencies scale the hardware's (measured) peaks: `mfu` and `mbu` for dense GEMMs
    (projections, MLPs, lm_head), `attention_mfu`/`attention_mbu` for attention kernels,
    `moe_mfu`/`moe_mbu` for the fused-MoE grouped GEMMs (None: `moe_efficiency` times mfu/mbu).
    With fp8 weights the GEMMs reach `fp8_mfu_scale` times their compute efficiency against the
    fp8 peak. Bandwidth efficiencies are against the measured copy rate (bytes read + written),
    which a read-mostly kernel can pass: they may exceed 1. `fitted()` builds the model with the
    constants experiments/fit_roofline.py fitted to this hardware's profile.

    Collectives (`self.collectives`, sim/costmodel/collectives.py): the measured tables of this
    hardware when any exist (`collective_table`: "auto", a CSV path, a list of those, or None), else
    alpha-beta: bus bandwidth NVLink * `comm_efficiency` inside a node, `inter_node_bandwidth_bytes_per_s`
    past it; latency `comm_graph_latency_s` inside a CUDA graph, `comm_eager_latency_s` outside,
    plus `comm_per_rank_latency_s` per extra rank and `inter_node_latency_s` past one node.

    Launch: a decode-only step of at most `cuda_graph_max_bs` (None: any number of) requests replays a CUDA graph
    (`hardware.cuda_graph_launch_s`, when `cuda_graph`); a step with extends of at most `piecewise_max_tokens`
    new tokens (None or 0: no such step) replays piecewise graphs as the runtime does -- its non-attention
    work padded to the captured token count (runtime.core.graph_grids), one graph launch plus
    `piecewise_layer_host_s` per layer on the host (a graph piece and the eager attention core; None:
    a graph launch + PIECEWISE_EAGER_KERNELS_PER_LAYER eager launches); any other step launches every kernel
    eagerly at `kernel_launch_s` each (None: the hardware's), plus `eager_launch_per_seq_s` per
    sequence (batch building), overlapped with GPU work, so only the host time
    beyond the GPU time shows (at least one launch). Each kernel also costs `kernel_floor_s` of
    GPU time (ramp and tail), plus `eager_kernel_gap_s` when launched eagerly (a graph's
    launches are queued on the GPU in advance). `kernels_per_layer=None` counts SGLang's kernels
    per layer kind. Per step the CPU adds `cpu_overhead_s + cpu_overhead_per_seq_s * seqs`, plus
    `cpu_overhead_per_extend_s` per prefill item and `cpu_overhead_per_token_s` per prefill token; the
    sampler adds `sampler_base_s + sampler_per_seq_s * seqs` of GPU time.
    """

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, layout: ParallelLayout,
                 mfu: float = 0.75, mbu: float = 0.85, attention_mfu: float = 0.55,
                 attention_mbu: float = 0.7, moe_efficiency: float = 0.7,
                 comm_efficiency: float = 0.7, comm_graph_latency_s: float = 8e-6,
                 comm_eager_latency_s: float = 15e-6, comm_per_rank_latency_s: float = 0.5e-6,
                 inter_node_bandwidth_bytes_per_s: float = 45e9, inter_node_latency_s: float = 15e-6,
                 collective_table: str | list[str] | None = "auto",
                 cuda_graph: bool = True, cuda_graph_max_bs: int | None = None,
                 kernels_per_layer: int | None = None, kernel_floor_s: float = 1.5e-6,
                 eager_kernel_gap_s: float = 1.0e-6,
                 cpu_overhead_s: float = 2e-4, cpu_overhead_per_seq_s: float = 2e-6,
                 sampler_base_s: float = 2e-5, sampler_per_seq_s: float = 5e-7,
                 elementwise_passes_per_layer: int = 8, kv_dtype_bytes: int = 2,
                 act_dtype_bytes: int = 2, cache_size: int = 65536,
                 moe_mfu: float | None = None, moe_mbu: float | None = None, fp8_mfu_scale: float = 1.0,
                 kernel_launch_s: float | None = None, eager_launch_per_seq_s: float = 0.0,
                 cpu_overhead_per_extend_s: float = 0.0, cpu_overhead_per_token_s: float = 0.0,
                 piecewise_max_tokens: int | None = None, piecewise_layer_host_s: float | None = None,
                 shared_kv_read_fraction: float = 1.0) -> None:
        layout.validate(model)
        if not 0 <= shared_kv_read_fraction <= 1:
            raise ValueError(f"shared_kv_read_fraction must be in [0, 1], got {shared_kv_read_fraction}")
        # of the KV tokens a decode step reads again (prefixes several requests share), the share that
        # costs memory bandwidth (1: each read as if private; 0: served from the L2 cache entirely)
        self.shared_kv_read_fraction = shared_kv_read_fraction
        for key, value, most in (("mfu", mfu, 1), ("mbu", mbu, MAX_MBU), ("attention_mfu", attention_mfu, 1),
                                 ("attention_mbu", attention_mbu, MAX_MBU), ("moe_efficiency", moe_efficiency, 1),
                                 ("comm_efficiency", comm_efficiency, 1), ("fp8_mfu_scale", fp8_mfu_scale, 1),
                                 ("moe_mfu", moe_mfu, 1), ("moe_mbu", moe_mbu, MAX_MBU)):
            if value is not None and not 0 < value <= most:
                raise ValueError(f"{key} must be in (0, {most}], got {value}")
        self.model, self.hardware, self.layout = model, hardware, layout
        self.cuda_graph, self.cuda_graph_max_bs = cuda_graph, cuda_graph_max_bs
        self.piecewise_buckets = (extend_token_buckets(piecewise_max_tokens)
                                  if cuda_graph and piecewise_max_tokens else [])
        self.cpu_overhead_s, self.cpu_overhead_per_seq_s = cpu_overhead_s, cpu_overhead_per_seq_s
        self.cpu_overhead_per_extend_s, self.cpu_overhead_per_token_s = cpu_overhead_per_extend_s, cpu_overhead_per_token_s
        self.kernel_launch_s = hardware.kernel_launch_s if kernel_launch_s is None else kernel_launch_s
        self.eager_launch_per_seq_s = eager_launch_per_seq_s
        self.piecewise_layer_host_s = (hardware.cuda_graph_launch_s
                                       + PIECEWISE_EAGER_KERNELS_PER_LAYER * self.kernel_launch_s
                                       if piecewise_layer_host_s is None else piecewise_layer_host_s)
        self.fit_constants: dict = {}    # what fitted() applied
        self.collectives = build_collectives(
            hardware, comm_efficiency=comm_efficiency, graph_latency_s=comm_graph_latency_s,
            eager_latency_s=comm_eager_latency_s, per_rank_latency_s=comm_per_rank_latency_s,
            inter_node_bandwidth_bytes_per_s=inter_node_bandwidth_bytes_per_s,
            inter_node_latency_s=inter_node_latency_s, table=collective_table)
        self.coef = LayerCoefficients.build(
            model, hardware, layout, mfu=mfu, mbu=mbu, attention_mfu=attention_mfu,
            attention_mbu=attention_mbu, moe_efficiency=moe_efficiency, moe_mfu=moe_mfu,
            moe_mbu=moe_mbu, fp8_mfu_scale=fp8_mfu_scale, kernels_per_layer=kernels_per_layer, kernel_floor_s=kernel_floor_s,
            eager_kernel_gap_s=eager_kernel_gap_s,
            sampler_base_s=sampler_base_s, sampler_per_seq_s=sampler_per_seq_s,
            elementwise_passes=elementwise_passes_per_layer, kv_dtype_bytes=kv_dtype_bytes,
            act_dtype_bytes=act_dtype_bytes)
        # Per-instance memo of everything that does not depend on decode context lengths.
        self._fixed = functools.lru_cache(maxsize=cache_size)(self._fixed_terms)

    @classmethod
    def fitted(cls, model: ModelSpec, hardware: HardwareSpec, layout: ParallelLayout,
               fit: str | None = "auto", **kwargs) -> "RooflineCostModel":
        """The roofline with the constants fitted to this hardware's profile replacing those of
        `kwargs` (fit: "auto" = sim/profiles/<hardware>/roofline_fit.yaml where it exists, else
        kwargs unchanged; a path; None). Keys the fit does not name keep their kwargs value."""
        constants = fitted_constants(hardware.name, fit)
        made = cls(model, hardware, layout, **{**kwargs, **constants})
        made.fit_constants = constants
        return made

    # -- public API -----------------------------------------------------------------
    def step_time_s(self, shape: StepShape) -> float:
        ctx = np.array([shape.decode_context_tokens], dtype=np.float64)
        return float(self._total_s(shape.extend_new_tokens, shape.extend_prefix_tokens,
                                   shape.num_decode_reqs, ctx, shape.decode_shared_tokens)[0])

    def host_time_s(self, shape: StepShape) -> float:
        return self._fixed(shape.extend_new_tokens, shape.extend_prefix_tokens, shape.num_decode_reqs).cpu_s

    def launch_time_s(self, shape: StepShape) -> float:
        return self._launch_host_s(self._fixed(shape.extend_new_tokens, shape.extend_prefix_tokens,
                                               shape.num_decode_reqs))

    def launch_bound_s(self, shape: StepShape) -> float:
        return 0.0      # priced as launched back to back (what the fitted constants were fitted on)

    def launch_ends_step(self, shape: StepShape) -> bool:
        return False      # priced as launched back to back

    def after_decode_saving_s(self, shape: StepShape) -> float:
        return 0.0      # one price per step, whatever ran ahead of it

    def idle_launch_factor(self, idle_s: float) -> float:
        return 1.0      # launches priced the same whatever the host did before

    def device_waits_for_launch(self, shape: StepShape) -> bool:
        return (self.cuda_graph and shape.is_decode_only
                and (self.cuda_graph_max_bs is None or shape.num_decode_reqs <= self.cuda_graph_max_bs))

    def decode_times_s(self, num_reqs: int, context_tokens: np.ndarray, shared_tokens: int = 0,
                       first_context_lens: np.ndarray | None = None) -> np.ndarray:
        ctx = np.asarray(context_tokens, dtype=np.float64)
        return self._total_s((), (), int(num_reqs), ctx, shared_tokens)

    def decode_segment_times_s(self, num_reqs: Sequence[int], segment_steps: Sequence[int],
                               context_tokens: np.ndarray, shared_tokens: Sequence[int],
                               first_context_lens: Sequence[np.ndarray | None]) -> np.ndarray:
        return decode_segments_one_by_one(self, num_reqs, segment_steps, context_tokens, shared_tokens,
                                          first_context_lens)

    def breakdown_s(self, shape: StepShape) -> dict[str, float]:
        fixed = self._fixed(shape.extend_new_tokens, shape.extend_prefix_tokens,
                            shape.num_decode_reqs)
        ctx = np.array([shape.decode_context_tokens], dtype=np.float64)
        out = dict(fixed.gpu_s)
        out["attn_decode"] = float(self._decode_attention_s(shape.num_decode_reqs, ctx, shape.decode_shared_tokens)[0])
        gpu = np.array([sum(out[op] for op in GPU_OPS)])
        out["launch"] = float(self._launch_s(fixed, gpu)[0])
        out["cpu_overhead"] = fixed.cpu_s
        return {op: out[op] for op in OPS}

    # -- internals ------------------------------------------------------------------
    def _fixed_terms(self, extend_new: tuple[int, ...], extend_prefix: tuple[int, ...],
                     num_decode: int) -> FixedTerms:
        use_graph = (self.cuda_graph and not extend_new and 0 < num_decode
                     and (self.cuda_graph_max_bs is None or num_decode <= self.cuda_graph_max_bs))
        padded = (padded_size(sum(extend_new) + num_decode, self.piecewise_buckets) if extend_new else None)
        terms = price_fixed_terms(self.coef, extend_new, extend_prefix, num_decode, use_graph,
                                  self.collectives, padded_tokens=padded)
        num_seqs = len(extend_new) + num_decode
        terms.cpu_s = (self.cpu_overhead_s + self.cpu_overhead_per_seq_s * num_seqs
                       + self.cpu_overhead_per_extend_s * len(extend_new)
                       + self.cpu_overhead_per_token_s * sum(extend_new))
        return terms

    def _total_s(self, extend_new: tuple[int, ...], extend_prefix: tuple[int, ...],
                 num_decode: int, ctx: np.ndarray, shared: int = 0) -> np.ndarray:
        fixed = self._fixed(extend_new, extend_prefix, num_decode)
        gpu = fixed.gpu_sum_s + self._decode_attention_s(num_decode, ctx, shared)
        return gpu + self._launch_s(fixed, gpu) + fixed.cpu_s

    def _decode_attention_s(self, num_decode: int, ctx: np.ndarray, shared: int = 0) -> np.ndarray:
        """Absorbed-MLA or GQA decode attention over all layers; linear in summed context, the KV
        tokens read again (`shared` of ctx) at `shared_kv_read_fraction` of their bytes."""
        c = self.coef
        flops = ctx * c.decode_flops_per_ctx
        read = ctx - (1.0 - self.shared_kv_read_fraction) * shared
        bytes_ = read * c.kv_bytes_per_token_layer + num_decode * c.decode_act_bytes_per_req
        per_layer = np.maximum(flops / c.attn_flops_per_s, bytes_ / c.attn_bytes_per_s)
        return per_layer * c.num_layers

    def _launch_host_s(self, fixed: FixedTerms) -> float:
        """Host time of the step's launch: one graph replay, piecewise pieces with the eager attention
        cores between them, or every kernel launched eagerly (plus per-sequence batch work)."""
        hw, c = self.hardware, self.coef
        if fixed.num_tokens == 0:
            return 0.0
        if fixed.use_graph:
            return hw.cuda_graph_launch_s
        if fixed.piecewise:
            return (hw.cuda_graph_launch_s + c.num_layers * self.piecewise_layer_host_s
                    + self.eager_launch_per_seq_s * fixed.num_seqs)
        return c.num_kernels * self.kernel_launch_s + self.eager_launch_per_seq_s * fixed.num_seqs

    def _launch_s(self, fixed: FixedTerms, gpu_s: np.ndarray) -> np.ndarray:
        """What the launch adds to the step's device time: a graph's launch, else the launch's host time
        the kernels do not cover (at least one kernel launch)."""
        if fixed.num_tokens == 0:
            return np.zeros_like(gpu_s)
        if fixed.use_graph:
            return np.full_like(gpu_s, self.hardware.cuda_graph_launch_s)
        floor = self.hardware.cuda_graph_launch_s if fixed.piecewise else self.kernel_launch_s
        return np.maximum(floor, self._launch_host_s(fixed) - gpu_s)


def fitted_constants(hardware_name: str, fit: str | None = "auto") -> dict:
    """The `constants` mapping of a fit file ({} for fit=None, or "auto" without a file)."""
    if fit is None:
        return {}
    path = PROFILES_DIR / hardware_name / FIT_FILE if fit == "auto" else Path(fit)
    if not path.exists():
        if fit == "auto":
            return {}
        raise FileNotFoundError(f"roofline fit {path} does not exist")
    return dict(yaml.safe_load(path.read_text())["constants"])
