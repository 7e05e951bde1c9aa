"""FlashInfer MLA attention (absorbed form) over the paged latent KV cache, for decode and extend.

Legend: B = sequences, T = query tokens (B in decode), N = heads, C = kv_lora_rank, R = rope dim, S = slots.

Versions: v1 (this file) wraps flashinfer.mla.BatchMLAPagedAttentionWrapper (FlashInfer 0.5) with page_size 1,
so FlashInfer's page indices are exactly our slot indices and no page table is built.
flashinfer is imported inside FlashInferMLA.__init__ only: importing this module never needs it.

How the runtime uses it (one object per device, owned by the runtime, no module state):
    mla = FlashInferMLA(device)                           # 128 MiB workspace
    mla.plan(qo_indptr, kv_indptr, kv_indices, kv_lens,   # ONCE per forward step (host work + one H2D copy)
             num_heads, kv_lora_rank, rope_dim, sm_scale, torch.bfloat16, torch.bfloat16, causal)
    for layer in layers:                                  # then once per layer, no host work
        out = mla.run(q_nope, q_rope, kv_pool[layer])     # [T, N, C]
Pass qo_indptr, kv_indptr and kv_lens as int32 CPU tensors (FlashInfer plans on the host; device tensors
cost a sync), kv_indices as an int32 device tensor. Decode: qo_indptr = arange(B + 1), causal=False.
Extend over a cached prefix: qo_indptr ragged, the new tokens' latents already stored and counted in
kv_indptr / kv_lens, causal=True (bottom-right aligned, matches ref.mla_extend_ref).

KV layout. FlashInfer reads ckv [pages, page_size, C] and kpe [pages, page_size, R] through their strides
(page stride taken from the tensor), so the combined pool [S, C + R] is used through views, no copy -- the
way SGLang calls it. Requirements: last dim contiguous, and row stride and the kpe offset (C) multiples of
8 elements (16-byte vector loads); C = 512, R = 64 satisfy this. A pool with two separate buffers
(ckv [S, C], kpe [S, R]) works as well through run_split(); neither layout needs a copy.
Supported shapes are those FlashInfer compiles: head_dim_ckv 512 and head_dim_kpe 64 (DeepSeek V2/V3).

CUDA graphs (use_cuda_graph=True). FlashInfer's graph mode keeps indptr/indices in fixed buffers, and a
wrapper may not change batch size, so this class keeps one wrapper per captured batch size; all share
this object's float workspace and fixed buffers (each wrapper still allocates FlashInfer's 8 MiB int
workspace plus 8 MiB pinned host memory). Protocol, decode only:
    mla = FlashInferMLA(device, use_cuda_graph=True, max_batch_size=256, max_kv_tokens=256 * max_ctx)
    for bs in capture_sizes:                    # capture
        mla.plan(...bs sequences...)            # outside the graph
        with torch.cuda.graph(g[bs]): model_forward()      # run() calls are captured
    mla.plan(...this step, padded to bs...)     # before every replay, outside the graph
    g[bs].replay()
Padded sequences can have kv_len 0 (SGLang's fill value for FlashInfer MLA); their outputs are ignored.
"""
from __future__ import annotations

import torch

from kernels.plan_fence import PlanFence

_PAGE_SIZE = 1   # one slot per page: kv_indices are slot indices


class FlashInferMLA:
    """Owns the FlashInfer workspace and the MLA wrapper(s) of one device."""

    def __init__(
        self,
        device: torch.device | str,
        workspace_bytes: int = 128 * 1024 * 1024,
        use_cuda_graph: bool = False,
        max_batch_size: int = 0,      # graph mode: largest captured batch size
        max_kv_tokens: int = 0,       # graph mode: capacity of the kv_indices buffer
        backend: str = "auto",        # FlashInfer picks fa3 on Hopper, fa2 elsewhere
    ) -> None:
        from flashinfer.mla import BatchMLAPagedAttentionWrapper   # absent flashinfer fails here, not on import

        self._wrapper_cls = BatchMLAPagedAttentionWrapper
        self.device = torch.device(device)
        self.backend = backend
        self.use_cuda_graph = use_cuda_graph
        self.workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=self.device)
        self._wrapper = None if use_cuda_graph else BatchMLAPagedAttentionWrapper(self.workspace, backend=backend)
        self._graph_wrappers: dict[int, object] = {}
        if use_cuda_graph:
            assert max_batch_size > 0 and max_kv_tokens > 0, "graph mode needs fixed buffer sizes"
            int32 = dict(dtype=torch.int32, device=self.device)
            self._qo_indptr_buf = torch.zeros(max_batch_size + 1, **int32)      # [B_max + 1]
            self._kv_indptr_buf = torch.zeros(max_batch_size + 1, **int32)      # [B_max + 1]
            self._kv_indices_buf = torch.zeros(max_kv_tokens, **int32)          # [L_total_max]
            self._kv_lens_buf = torch.zeros(max_batch_size, **int32)            # [B_max]
        self._active = self._wrapper
        self._latent_dim = 0
        self._rope_dim = 0
        self._fence = PlanFence()                        # see kernels/plan_fence.py

    def _graph_wrapper(self, batch_size: int):
        """The graph-mode wrapper bound to the first batch_size entries of the fixed buffers."""
        if batch_size not in self._graph_wrappers:
            assert batch_size < self._qo_indptr_buf.numel(), "batch larger than max_batch_size"
            self._graph_wrappers[batch_size] = self._wrapper_cls(
                self.workspace, use_cuda_graph=True,
                qo_indptr=self._qo_indptr_buf[: batch_size + 1],
                kv_indptr=self._kv_indptr_buf[: batch_size + 1],
                kv_indices=self._kv_indices_buf,
                kv_len_arr=self._kv_lens_buf[:batch_size],
                backend=self.backend,
            )
        return self._graph_wrappers[batch_size]

    def plan(
        self,
        qo_indptr: torch.Tensor,    # [B + 1] int (CPU preferred)
        kv_indptr: torch.Tensor,    # [B + 1] int (CPU preferred)
        kv_indices: torch.Tensor,   # [sum L] int slots (device)
        kv_lens: torch.Tensor | None,   # [B] int (CPU preferred); None: derived from kv_indptr
        num_heads: int,
        kv_lora_rank: int,
        rope_dim: int,
        sm_scale: float,
        q_dtype: torch.dtype,
        kv_dtype: torch.dtype,
        causal: bool = False,
    ) -> None:
        """Schedule one forward step; every run() until the next plan() uses this schedule."""
        qo_indptr = qo_indptr.to(torch.int32)
        kv_indptr = kv_indptr.to(torch.int32)
        if kv_lens is None:
            kv_lens = kv_indptr[1:] - kv_indptr[:-1]
        kv_lens = kv_lens.to(torch.int32)
        kv_indices = kv_indices.to(device=self.device, dtype=torch.int32)
        batch_size = qo_indptr.numel() - 1
        self._fence.wait()
        if self.use_cuda_graph:
            assert kv_indices.numel() <= self._kv_indices_buf.numel(), "kv_indices exceed max_kv_tokens"
            self._active = self._graph_wrapper(batch_size)
        self._active.plan(
            qo_indptr, kv_indptr, kv_indices, kv_lens,
            num_heads, kv_lora_rank, rope_dim, _PAGE_SIZE, causal, sm_scale, q_dtype, kv_dtype,
        )
        self._fence.mark()
        self._latent_dim, self._rope_dim = kv_lora_rank, rope_dim

    def run(
        self,
        q_nope: torch.Tensor,          # [T, N, C]
        q_rope: torch.Tensor,          # [T, N, R]
        kv_cache_layer: torch.Tensor,  # [S, C + R] one layer of the combined latent pool
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:                 # [T, N, C]
        """Attention of one layer over the combined pool (views, no copy)."""
        latent_dim = self._latent_dim
        assert kv_cache_layer.shape[-1] == latent_dim + self._rope_dim, "pool width differs from plan()"
        paged = kv_cache_layer.unsqueeze(1)                                   # [S, 1, C + R]
        return self.run_split(q_nope, q_rope, paged[:, :, :latent_dim], paged[:, :, latent_dim:], out)

    def run_split(
        self,
        q_nope: torch.Tensor,   # [T, N, C]
        q_rope: torch.Tensor,   # [T, N, R]
        ckv: torch.Tensor,      # [S, C] or [S, 1, C]
        kpe: torch.Tensor,      # [S, R] or [S, 1, R]
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:          # [T, N, C]
        """Attention of one layer over separate latent / rope buffers (or views)."""
        assert self._active is not None and self._latent_dim, "call plan() first"
        if ckv.dim() == 2:
            ckv, kpe = ckv.unsqueeze(1), kpe.unsqueeze(1)                     # page_size 1
        if out is None:
            return self._active.run(q_nope, q_rope, ckv, kpe)
        return self._active.run(q_nope, q_rope, ckv, kpe, out=out)


def flashinfer_available() -> bool:
    """True when flashinfer imports (it may still need a GPU and JIT-compiles at first use)."""
    try:
        import flashinfer.mla  # noqa: F401
    except Exception:  # ImportError, or a broken CUDA setup raising at import
        return False
    return True
