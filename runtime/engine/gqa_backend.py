"""The fast attention backend of MHA/GQA models (Llama, Qwen2-MoE) on CUDA: FlashInfer paged prefill/decode
(Triton fallback), with the same planning interface as FastMLABackend, and the graph-mode backend of any
model family for the CUDA-graph runner (`make_graph_backend`).

Legend: T = new tokens, B = sequences, N = query heads, Hkv = KV heads, D = head dim, S = KV slots.
Kernel modules are imported lazily: importing this file needs neither a GPU nor flashinfer.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from runtime.engine.forward_batch import ForwardBatch, cpu_int32 as _cpu_int32, indptr as _indptr
from runtime.engine.kv_pool import MHAKVPool, MLAKVPool
from runtime.models.attention import Attention

GQA_KERNELS = ("auto", "flashinfer", "triton")
_FLASHINFER_HEAD_DIMS = (64, 128, 256)   # head dims FlashInfer's prefill/decode kernels are compiled for
_EAGER_WORKSPACE_BYTES = 512 * 2**20     # the eager wrapper also plans long prefill chunks
_GRAPH_WORKSPACE_BYTES = 1024 * 2**20    # decode graphs up to max_running_requests sequences


@dataclass(frozen=True)
class GQAShape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sm_scale: float
    dtype: torch.dtype


def gqa_shape(model: nn.Module, dtype: torch.dtype) -> GQAShape:
    """Every attention layer shares heads, head dim and softmax scale; read them from the first."""
    layer = next(m for m in model.modules() if isinstance(m, Attention))
    return GQAShape(layer.num_heads, layer.num_kv_heads, layer.head_dim, float(layer.scale), dtype)


def choose_gqa_kernel(requested: str, shape: GQAShape) -> str:
    """'flashinfer' when asked for (or auto) and usable for this head dim / dtype, else 'triton'."""
    if requested not in GQA_KERNELS:
        raise ValueError(f"attention kernel {requested!r}: expected one of {GQA_KERNELS}")
    if requested == "triton":
        return "triton"
    from kernels.gqa_attention.flashinfer_gqa import flashinfer_available

    usable = (shape.head_dim in _FLASHINFER_HEAD_DIMS and shape.dtype in (torch.bfloat16, torch.float16)
              and flashinfer_available())
    if not usable and requested == "flashinfer":
        raise RuntimeError("attention kernel flashinfer: flashinfer is not importable or does not support "
                           f"head_dim={shape.head_dim}, {shape.dtype}")
    if not usable:
        warnings.warn("FlashInfer GQA unavailable for this model/dtype; using the Triton attention kernel")
    return "flashinfer" if usable else "triton"



class FastGQABackend:
    """AttentionBackend for MHA pools on CUDA. `plan_step(fb)` once per step (host work), then every layer's
    `mha()` stores the new k/v (one Triton launch) and attends with no host work.

    Decode steps: FlashInfer decode (or the Triton kernel with one query token per sequence). Steps with
    extends: FlashInfer causal prefill over the paged prefix + new tokens (bottom-right aligned, matches
    the reference) or the Triton kernel. `auto_plan=True` (eager use) plans lazily when handed a batch it has
    not planned; the CUDA-graph runner uses `auto_plan=False` and plans before each replay itself through
    `plan_flashinfer` (and, without flashinfer, needs no plan: decode is the Triton kernel's default).
    `mla()` is not supported (MLA models use FastMLABackend)."""

    def __init__(self, shape: GQAShape, kernel: str, device: torch.device, auto_plan: bool = True,
                 flashinfer=None) -> None:
        from kernels.gqa_attention.triton_attention import gqa_attention_triton
        from kernels.small_ops.triton_kv_store import store_kv_triton

        self.shape, self.kernel, self.device, self.auto_plan = shape, kernel, device, auto_plan
        if kernel == "flashinfer" and flashinfer is None:
            from kernels.gqa_attention.flashinfer_gqa import FlashInferGQA
            flashinfer = FlashInferGQA(device, workspace_bytes=_EAGER_WORKSPACE_BYTES)
        self.flashinfer = flashinfer
        self._store, self._attend_triton = store_kv_triton, gqa_attention_triton
        self._planned: ForwardBatch | None = None
        self._max_q_len = 1             # the Triton kernel's grid; 1 (decode) unless a plan says otherwise

    # -- planning (host, once per step) ----------------------------------------------------
    def plan_step(self, fb: ForwardBatch) -> None:
        self._max_q_len = max(fb.extend_lens_cpu, default=1)
        if self.flashinfer is not None:
            self.plan_flashinfer(_cpu_int32(_indptr(fb.extend_lens_cpu)), _cpu_int32(_indptr(fb.seq_lens_cpu)),
                                 fb.kv_indices, _cpu_int32(fb.seq_lens_cpu), causal=not fb.all_decode)
        self._planned = fb

    def plan_flashinfer(self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                        kv_lens: torch.Tensor, causal: bool) -> None:
        """qo_indptr, kv_indptr, kv_lens: int32 CPU tensors; kv_indices: int32 on the device."""
        s = self.shape
        self.flashinfer.plan(qo_indptr, kv_indptr, kv_indices, kv_lens, s.num_heads, s.num_kv_heads,
                             s.head_dim, s.sm_scale, s.dtype, s.dtype, causal=causal)

    # -- AttentionBackend ------------------------------------------------------------------
    def mha(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            fb: ForwardBatch, pool: MHAKVPool, scale: float) -> torch.Tensor:
        """q [T, N, D]; k, v [T, Hkv, D] (row-strided views of the qkv output are fine) -> [T, N, D]."""
        if scale != self.shape.sm_scale:
            raise ValueError(f"layer {layer} softmax scale {scale} differs from the planned {self.shape.sm_scale}")
        if self.auto_plan and self._planned is not fb:
            self.plan_step(fb)
        k_cache, v_cache = pool.get_kv(layer)                              # [S, Hkv, D] each
        self._store(k_cache, v_cache, fb.out_cache_loc, k, v)
        q = q.contiguous()
        if self.flashinfer is not None:
            return self.flashinfer.run(q, k_cache, v_cache)                # [T, N, D]
        return self._attend_triton(q, k_cache, v_cache, fb.qo_indptr, fb.kv_indptr, fb.kv_indices, scale,
                                   max_q_len=self._max_q_len, causal=True)

    def mla(self, layer: int, q_latent: torch.Tensor, q_rope: torch.Tensor, c_kv: torch.Tensor,
            k_rope: torch.Tensor, fb: ForwardBatch, pool: MLAKVPool, scale: float) -> torch.Tensor:
        raise TypeError("FastGQABackend serves MHA/GQA layers; MLA models use FastMLABackend")


def make_graph_backend(model: nn.Module, dtype: torch.dtype, device: torch.device, max_bs: int,
                       max_kv_tokens: int, kernel: str = "auto"):
    """The attention backend a CUDA-graph runner captures decode steps with, for any model family:
    FastMLABackend (MLA pools) or FastGQABackend (MHA pools), `auto_plan=False`, FlashInfer in graph mode
    (fixed index buffers for up to max_bs sequences and max_kv_tokens KV tokens) or the Triton kernels.
    kernel: auto | flashinfer | triton, chosen per family as enable_fast_path chooses (pass the eager
    backend's `.kernel` to keep both the same). Before each replay the runner calls
    `backend.plan_flashinfer(...)` when `backend.flashinfer is not None`."""
    if model.config.use_mla:
        from runtime.engine.fast_path import FastMLABackend, choose_mla_kernel, mla_shape

        mla = mla_shape(model, dtype)
        chosen = choose_mla_kernel(kernel, mla)
        flashinfer = None
        if chosen == "flashinfer":
            from kernels.mla_attention.flashinfer_mla import FlashInferMLA
            flashinfer = FlashInferMLA(device, use_cuda_graph=True, max_batch_size=max_bs, max_kv_tokens=max_kv_tokens)
        return FastMLABackend(mla, chosen, device, auto_plan=False, flashinfer=flashinfer)
    shape = gqa_shape(model, dtype)
    chosen = choose_gqa_kernel(kernel, shape)
    flashinfer = None
    if chosen == "flashinfer":
        from kernels.gqa_attention.flashinfer_gqa import FlashInferGQA
        # split-KV decode of up to max_bs sequences stages partial outputs in the workspace (Llama-3-8B at
        # batch 1024 needs ~335 MiB), so graph mode gets a larger one than FlashInfer's 128 MiB default
        flashinfer = FlashInferGQA(device, workspace_bytes=_GRAPH_WORKSPACE_BYTES, use_cuda_graph=True,
                                   max_batch_size=max_bs, max_kv_tokens=max_kv_tokens)
    return FastGQABackend(shape, chosen, device, auto_plan=False, flashinfer=flashinfer)
