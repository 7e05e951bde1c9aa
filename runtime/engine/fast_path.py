"""The CUDA fast path of the model runner: an MLA attention backend on FlashInfer (Triton / torch SDPA fallback; the GQA
backend of Llama / Qwen2-MoE is runtime/engine/gqa_backend.py), the
Triton fused MoE behind `set_experts_fn`, Triton small ops (add + RMSNorm, SiLU-and-mul, rotary) behind
`CausalLM.small_ops`, and switches back to the torch reference (benchmarks, tests).

Legend: T = new tokens, B = sequences, N = heads, C = kv_lora_rank, R = rope dim, S = KV slots,
K = attended tokens, Dqk = qk_nope + R, Dv = v_head_dim.
CPU never reaches this module's kernels: `enable_fast_path` returns None there and changes nothing.
Kernel modules are imported lazily, so importing this file needs neither a GPU nor flashinfer.
"""
from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from runtime.core.mla_form import mla_attends_as_mha
from runtime.engine.forward_batch import ForwardBatch, cpu_int32 as _cpu_int32, indptr as _indptr
from runtime.engine.gqa_backend import FastGQABackend, choose_gqa_kernel, gqa_shape
from runtime.engine.kv_pool import MHAKVPool, MLAKVPool
from runtime.models.attention_backend import TorchAttentionBackend
from runtime.models.base import CausalLM
from runtime.models.config import ModelConfig
from runtime.models.layers import RMSNorm
from runtime.models.mla import MLAttention
from runtime.models.moe import MoE, TopKRouter, set_experts_fn

MLA_KERNELS = ("auto", "flashinfer", "triton")
_FLASHINFER_DIMS = (512, 64)   # (kv_lora_rank, rope dim) FlashInfer's MLA kernels are compiled for
_EAGER_WORKSPACE_BYTES = 512 * 2**20   # the eager wrapper also plans long prefill chunks
_MIN_ROPE_POSITIONS = 131072            # rows of the fused rotary table at least (64 MiB at R = 128)


@dataclass
class FastPathConfig:
    """What the runner enables on CUDA. Every field is ignored on CPU (the torch reference runs)."""

    enabled: bool = True                 # FlashInfer/Triton MLA + Triton fused MoE
    cuda_graph: bool = True              # capture decode steps (MLA models with the fast path only)
    cuda_graph_max_bs: int = 1024        # largest captured decode batch; larger batches run eagerly
    cuda_graph_batch_sizes: tuple[int, ...] | None = None   # explicit sizes (benchmarks); None = the grid
    piecewise_cuda_graph: bool = False   # extend/mixed steps through per-layer graph pieces (attention eager)
    piecewise_max_tokens: int = 8192     # largest captured step (new tokens); larger steps run eagerly
    piecewise_token_buckets: tuple[int, ...] | None = None   # explicit sizes (tests, benchmarks); None = the grid
    mla_kernel: str = "auto"             # attention kernel, MLA and GQA: auto (FlashInfer when importable) | flashinfer | triton
    fused_small_ops: bool = True         # Triton add+RMSNorm / RMSNorm / SiLU-and-mul / rotary in the model
    layer_fusions: bool = True           # stacked shared experts, kernel routing (SmallOps.route), one MLA input GEMM
    progress: bool = True                # tqdm bar during capture


@dataclass(frozen=True)
class MLAShape:
    num_heads: int
    kv_lora_rank: int
    rope_dim: int
    sm_scale: float
    dtype: torch.dtype
    nope_dim: int          # MHA form: q/k head dim nope_dim + rope_dim, v head dim v_dim
    v_dim: int


def mla_shape(model: nn.Module, dtype: torch.dtype) -> MLAShape:
    """Every MLA layer shares heads, ranks and softmax scale; read them from the first."""
    layer = next(m for m in model.modules() if isinstance(m, MLAttention))
    return MLAShape(layer.num_heads, layer.kv_lora_rank, layer.rope_dim, float(layer.scale), dtype,
                    layer.nope_dim, layer.v_dim)


def choose_mla_kernel(requested: str, shape: MLAShape) -> str:
    """'flashinfer' when asked for (or auto) and usable for these shapes/dtype, else 'triton'."""
    if requested not in MLA_KERNELS:
        raise ValueError(f"mla_kernel {requested!r}: expected one of {MLA_KERNELS}")
    if requested == "triton":
        return "triton"
    from kernels.mla_attention.flashinfer_mla import flashinfer_available

    usable = ((shape.kv_lora_rank, shape.rope_dim) == _FLASHINFER_DIMS
              and shape.dtype in (torch.bfloat16, torch.float16) and flashinfer_available())
    if not usable and requested == "flashinfer":
        raise RuntimeError("mla_kernel=flashinfer: flashinfer is not importable or does not support "
                           f"C={shape.kv_lora_rank}, R={shape.rope_dim}, {shape.dtype}")
    if not usable:
        warnings.warn("FlashInfer MLA unavailable for this model/dtype; using the Triton MLA kernels")
    return "flashinfer" if usable else "triton"


def never_mha(prefix_lens: Sequence[int], seq_lens: Sequence[int]) -> bool:
    """An mha_rule keeping every MLA step in absorbed form (benchmarks, tests)."""
    return False



class FastMLABackend:
    """AttentionBackend for MLA pools on CUDA. `plan_step(fb)` once per step (host work), then every
    layer's `mla()` stores the new latents (one Triton launch) and attends with no host work.

    Decode steps: FlashInfer decode (causal=False) or Triton split-KV decode. Steps with extends, absorbed
    form: FlashInfer causal extend (bottom-right aligned, matches the reference) or the Triton row kernel.
    Steps `mha_rule` sends to MHA form (runtime.core.mla_form, SGLang's rule; `never_mha` turns it off): the
    layers call `mla_store()` then `mla_mha()`: k = [k_nope | k_pe] laid out by one Triton copy, then a
    FlashInfer causal ragged prefill (Dqk, Dv) planned once per step (sharing the MLA wrapper's workspace),
    or torch SDPA per sequence without FlashInfer.
    `auto_plan=True` (eager use) plans lazily when handed a batch it has not planned; the CUDA-graph
    runner uses `auto_plan=False` and plans before each replay itself. `mha()` is the torch reference."""

    def __init__(self, shape: MLAShape, kernel: str, device: torch.device, auto_plan: bool = True,
                 flashinfer=None,
                 mha_rule: Callable[[Sequence[int], Sequence[int]], bool] = mla_attends_as_mha) -> None:
        from kernels.mla_attention.triton_concat_k import concat_mla_k_triton
        from kernels.mla_attention.triton_decode import mla_decode_triton, mla_extend_triton
        from kernels.small_ops.triton_kv_store import store_mla_kv_triton

        self.shape, self.kernel, self.device, self.auto_plan = shape, kernel, device, auto_plan
        if kernel == "flashinfer" and flashinfer is None:
            from kernels.mla_attention.flashinfer_mla import FlashInferMLA
            flashinfer = FlashInferMLA(device, workspace_bytes=_EAGER_WORKSPACE_BYTES)
        self.flashinfer = flashinfer
        self._store, self._decode_triton, self._extend_triton = store_mla_kv_triton, mla_decode_triton, mla_extend_triton
        self._triton_cfg = self._triton_config()
        self._concat_k = concat_mla_k_triton
        self.mha_rule = mha_rule              # (prefix_lens, seq_lens) of an extend step -> MHA form?
        self.mha_prefill = None               # FlashInferMHAPrefill, built at the first MHA-form step
        self._planned: ForwardBatch | None = None
        self._decode = True
        self._as_mha = False
        self._mha_indptr: tuple[list[int], list[int]] = ([0], [0])   # (qo, kv) of an MHA-form step
        self._reference = TorchAttentionBackend()

    # -- planning (host, once per step) ----------------------------------------------------
    def plan_step(self, fb: ForwardBatch) -> None:
        self._decode = fb.all_decode
        self._as_mha = not self._decode and self.mha_rule(fb.prefix_lens_cpu, fb.seq_lens_cpu)
        qo_indptr, kv_indptr = _indptr(fb.extend_lens_cpu), _indptr(fb.seq_lens_cpu)
        if self._as_mha:
            self._plan_mha(qo_indptr, kv_indptr)
        elif self.flashinfer is not None:
            self.plan_flashinfer(_cpu_int32(qo_indptr), _cpu_int32(kv_indptr), fb.kv_indices,
                                 _cpu_int32(fb.seq_lens_cpu), causal=not self._decode)
        self._planned = fb

    def _plan_mha(self, qo_indptr: list[int], kv_indptr: list[int]) -> None:
        s = self.shape
        self._mha_indptr = (qo_indptr, kv_indptr)
        if self.flashinfer is None:
            return                                                       # SDPA reads the host lists
        if self.mha_prefill is None:
            from kernels.mla_attention.flashinfer_mha_prefill import FlashInferMHAPrefill
            self.mha_prefill = FlashInferMHAPrefill(self.device, workspace=self.flashinfer.workspace)
        self.mha_prefill.plan(_cpu_int32(qo_indptr), _cpu_int32(kv_indptr), s.num_heads,
                              s.nope_dim + s.rope_dim, s.v_dim, s.sm_scale, s.dtype)

    def plan_flashinfer(self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                        kv_lens: torch.Tensor, causal: bool) -> None:
        """qo_indptr, kv_indptr, kv_lens: int32 CPU tensors; kv_indices: int32 on the device."""
        s = self.shape
        self.flashinfer.plan(qo_indptr, kv_indptr, kv_indices, kv_lens, s.num_heads, s.kv_lora_rank,
                             s.rope_dim, s.sm_scale, s.dtype, s.dtype, causal=causal)

    # -- AttentionBackend ------------------------------------------------------------------
    def mha(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            fb: ForwardBatch, pool: MHAKVPool, scale: float) -> torch.Tensor:
        return self._reference.mha(layer, q, k, v, fb, pool, scale)

    def mla(self, layer: int, q_latent: torch.Tensor, q_rope: torch.Tensor, c_kv: torch.Tensor,
            k_rope: torch.Tensor, fb: ForwardBatch, pool: MLAKVPool, scale: float) -> torch.Tensor:
        if scale != self.shape.sm_scale:
            raise ValueError(f"layer {layer} softmax scale {scale} differs from the planned {self.shape.sm_scale}")
        if self.auto_plan and self._planned is not fb:
            self.plan_step(fb)
        if self._as_mha:
            raise RuntimeError("step planned in MHA form: its layers call mla_store() and mla_mha()")
        cache = pool.get_kv(layer)                                         # [S, C + R]
        self._store(cache, fb.out_cache_loc, _rows(c_kv), _rows(k_rope))   # row-strided views are fine
        if self.flashinfer is not None:
            return self.flashinfer.run(q_latent.contiguous(), q_rope.contiguous(), cache)   # [T, N, C]
        if self._decode:
            return self._decode_triton(q_latent, q_rope, cache, fb.kv_indptr, fb.kv_indices, scale,
                                       config=self._triton_cfg)
        return self._extend_triton(q_latent, q_rope, cache, fb.qo_indptr, fb.kv_indptr, fb.kv_indices, scale,
                                   causal=True, config=self._triton_cfg)

    def mla_as_mha(self, fb: ForwardBatch) -> bool:
        if self.auto_plan and self._planned is not fb:
            self.plan_step(fb)
        return self._as_mha

    def mla_store(self, layer: int, c_kv: torch.Tensor, k_rope: torch.Tensor, fb: ForwardBatch,
                  pool: MLAKVPool) -> None:
        self._store(pool.get_kv(layer), fb.out_cache_loc, _rows(c_kv), _rows(k_rope))

    def mla_mha(self, layer: int, q: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor, v: torch.Tensor,
                fb: ForwardBatch, scale: float) -> torch.Tensor:   # [T, N, Dqk], [K, N, Dn], [K, R], [K, N, Dv]
        if scale != self.shape.sm_scale:
            raise ValueError(f"layer {layer} softmax scale {scale} differs from the planned {self.shape.sm_scale}")
        if not self._as_mha or self._planned is not fb:
            raise RuntimeError("mla_mha() on a step not planned in MHA form")
        k = self._concat_k(k_nope, _rows(k_rope))                           # [K, N, Dqk]
        if self.mha_prefill is not None:
            return self.mha_prefill.run(q, k, v)                           # [T, N, Dv]
        from kernels.mla_attention.sdpa_prefill import mha_prefill_sdpa
        return mha_prefill_sdpa(q, k, v, *self._mha_indptr, scale)

    def _triton_config(self):
        """Default tiles, but half-height KV tiles in fp32 (a [32, 512] fp32 tile per stage is 64 KiB
        of shared memory)."""
        from kernels.mla_attention.triton_decode import MLADecodeConfig, default_config

        cfg = default_config(self.shape.num_heads, self.shape.kv_lora_rank)
        if self.shape.dtype == torch.float32:
            cfg = MLADecodeConfig(block_h=cfg.block_h, block_n=16, num_warps=cfg.num_warps, num_stages=2)
        return cfg


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x itself when its rows are contiguous (any row stride), else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


class FusedSmallOps:
    """runtime.models.layers.SmallOps on the Triton kernels of kernels/small_ops: one launch per norm
    (the residual add fused in, both updated in place), per SiLU-and-mul and per q/k rotary pair.
    Rotary reads a [P, R] cos/sin table built once from the model's own RotaryEmbedding, so the angles
    are the reference's. Triton rather than FlashInfer for rotary: DeepSeek's rope dims are the last R of
    each q head and of the kv_a output, strided views FlashInfer's in-place rope cannot take without copies.
    Runs wherever Triton does (CPU tests use its interpreter); no host syncs (CUDA-graph safe)."""

    def __init__(self, model: CausalLM, routes_few_tokens: bool = True) -> None:
        from kernels.small_ops.triton_act import silu_and_mul_triton
        from kernels.small_ops.triton_gated_act import silu_and_mul_gated_triton
        from kernels.small_ops.triton_norm import fused_add_rmsnorm_triton, rmsnorm_triton
        from kernels.small_ops.triton_rope import rope_triton
        from kernels.fused_moe.router_topk import router_topk

        self._rmsnorm, self._add_rmsnorm = rmsnorm_triton, fused_add_rmsnorm_triton
        self._silu_and_mul, self._rope = silu_and_mul_triton, rope_triton
        self._silu_and_mul_gated = silu_and_mul_gated_triton
        self._router_topk = router_topk
        self.routes_few_tokens = routes_few_tokens
        # [P, R] fp32. The kernel does not bound-check positions while the reference rotates any position:
        # the table covers at least _MIN_ROPE_POSITIONS even when the config's maximum is smaller (Llama-3-8B:
        # 8,192), and longer contexts get the reference's angles instead of reads past the table
        positions = max(model.config.max_position_embeddings, _MIN_ROPE_POSITIONS)
        self.cos_sin_cache = model.rotary.cos_sin_cache(positions)

    def rmsnorm(self, x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        return self._rmsnorm(x, norm.weight, norm.eps)

    def add_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor,
                    norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        return self._add_rmsnorm(x, residual, norm.weight, norm.eps, inplace=True)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self._silu_and_mul(gate_up)

    def silu_and_mul_gated(self, gate_up: torch.Tensor, gate_logit: torch.Tensor) -> torch.Tensor:
        return self._silu_and_mul_gated(gate_up, gate_logit)

    def rope(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, interleaved: bool,
             q_out: torch.Tensor | None = None) -> None:
        self._rope(positions, q, k, self.cos_sin_cache, not interleaved, q_out=q_out)

    def route(self, x: torch.Tensor, router_rows: torch.Tensor, num_experts: int, top_k: int, scoring_func: str,
              norm_topk_prob: bool, routed_scaling_factor: float, num_shared: int,
              gate_row: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._router_topk(x, router_rows, num_experts, top_k, scoring_func=scoring_func,
                                 norm_topk_prob=norm_topk_prob, routed_scaling_factor=routed_scaling_factor,
                                 num_shared=num_shared, gate_row=gate_row)


def has_moe(model: nn.Module) -> bool:
    return any(isinstance(m, MoE) for m in model.modules())


def enable_fast_path(model: nn.Module, config: ModelConfig, dtype: torch.dtype, device: torch.device,
                     mla_kernel: str = "auto", fused_small_ops: bool = True,
                     layer_fusions: bool = True) -> FastMLABackend | FastGQABackend | None:
    """On CUDA: route MoE layers through the Triton fused MoE with their shared experts stacked as experts
    (one rank), the small ops through FusedSmallOps and the MLA input projections through one stacked GEMM
    (if asked; `layer_fusions=False` keeps the layers as loaded and routes with the router GEMM), and return
    the attention backend: FastMLABackend for MLA models, FastGQABackend (FlashInfer
    paged GQA, Triton fallback; `mla_kernel` picks between them the same way) for MHA/GQA models.
    On CPU: change nothing, return None."""
    if device.type != "cuda":
        return None
    if fused_small_ops:
        model.small_ops = FusedSmallOps(model, routes_few_tokens=layer_fusions)
        for attn in (m for m in model.modules() if isinstance(m, MLAttention) and layer_fusions):
            attn.fuse_input_projections()
        for router in (m for m in model.modules() if isinstance(m, TopKRouter)):
            router.weight_f32()                  # allocate now, not inside a graph warm-up
        for moe in (m for m in model.modules() if isinstance(m, MoE)):
            moe.fused_router_weight()
    if has_moe(model):
        from kernels.fused_moe.fused_moe_triton import fused_moe
        set_experts_fn(model, fused_moe)
        if layer_fusions:
            fuse_shared_experts(model, fused_moe)
    if not config.use_mla:
        shape = gqa_shape(model, dtype)
        return FastGQABackend(shape, choose_gqa_kernel(mla_kernel, shape), device)
    shape = mla_shape(model, dtype)
    return FastMLABackend(shape, choose_mla_kernel(mla_kernel, shape), device)


def fuse_shared_experts(model: nn.Module, fused_moe_fn: Callable) -> int:
    """Stack every MoE layer's shared experts after its routed ones (MoE.fuse_shared_experts: one rank,
    after loading), so each layer's experts run in one fused-MoE call whose launch configs still come from
    the routed experts' tuned table. Layer by layer, returning each layer's replaced tensors to the device
    before the next (the KV pool is sized after this). Returns how many layers were fused."""
    fused = 0
    for moe in (m for m in model.modules() if isinstance(m, MoE)):
        if moe.fuse_shared_experts():
            moe.experts_fn = functools.partial(
                fused_moe_fn, config_shape=(moe.experts.num_local, moe.gate.config.num_experts_per_tok))
            fused += 1
            if moe.experts.w13.is_cuda:
                torch.cuda.empty_cache()
    return fused


@contextmanager
def torch_reference_small_ops(model: nn.Module) -> Iterator[None]:
    """Temporarily run the model's small ops as torch code (restores the previous setting). Like
    torch_reference_experts, captured CUDA graphs keep the kernels they recorded."""
    saved, model.small_ops = model.small_ops, None
    try:
        yield
    finally:
        model.small_ops = saved


@contextmanager
def torch_reference_experts(model: nn.Module) -> Iterator[None]:
    """Temporarily route every MoE layer through the torch reference (restores the previous functions).
    Captured CUDA graphs are unaffected: they replay the kernels they recorded."""
    from kernels.fused_moe.ref import fused_moe_ref

    layers = [m for m in model.modules() if isinstance(m, MoE)]
    saved = [layer.experts_fn for layer in layers]
    set_experts_fn(model, fused_moe_ref)
    try:
        yield
    finally:
        for layer, fn in zip(layers, saved):
            layer.experts_fn = fn
