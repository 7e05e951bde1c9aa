"""FlashInfer attention over the paged MHA/GQA KV cache (page size 1, NHD): extend with a cached prefix, decode.

Legend: B = sequences, T = query tokens (B in decode), N = query heads, Hkv = KV heads, D = head dim, S = slots.

Versions: v1 (this file) wraps flashinfer.BatchPrefillWithPagedKVCacheWrapper (causal extend over prefix + new
tokens, all in the paged pool) and flashinfer.BatchDecodeWithPagedKVCacheWrapper (FlashInfer 0.5). With page
size 1 FlashInfer's page indices are our slot indices, every "last page" holds one token, and the pool's
per-layer k/v buffers [S, Hkv, D] are FlashInfer's NHD pages through a view ([S, 1, Hkv, D]), no copy.
flashinfer is imported inside FlashInferGQA.__init__ only: importing this module never needs it.

How the runtime uses it (one object per device, no module state):
    gqa = FlashInferGQA(device)
    gqa.plan(qo_indptr, kv_indptr, kv_indices, kv_lens,        # ONCE per forward step (host work)
             num_heads, num_kv_heads, head_dim, sm_scale, torch.bfloat16, torch.bfloat16, causal)
    for layer in layers:                                        # then per layer, no host work
        out = gqa.run(q, k_pool[layer], v_pool[layer])         # [T, N, D]
qo_indptr, kv_indptr, kv_lens: int32 CPU tensors (FlashInfer plans on the host); kv_indices: int32 on the device.
A batch whose every sequence has one new token runs the decode kernel (causal is then irrelevant); any other
batch runs the prefill kernel with `causal` (bottom-right aligned, as ref.gqa_attention_ref).
Decode uses FlashInfer's tensor-core (prefill-kernel) decode when the group N / Hkv is >= 4, as SGLang does.

CUDA graphs (use_cuda_graph=True), decode only: fixed kv_indptr / kv_indices / last-page buffers shared by one
decode wrapper per captured batch size (a graph-mode wrapper may not change its batch size):
    gqa = FlashInferGQA(device, use_cuda_graph=True, max_batch_size=256, max_kv_tokens=...)
    gqa.plan(...bs sequences...)                # outside the graph, before capture and before every replay
    with torch.cuda.graph(g): ... gqa.run(...)  # run() is captured; it reads the fixed buffers
"""
from __future__ import annotations

import torch

from kernels.plan_fence import PlanFence

_PAGE_SIZE = 1
TENSOR_CORE_MIN_GROUP = 4     # SGLang's rule for bf16/fp16 KV: tensor-core decode from group size 4


class FlashInferGQA:
    """Owns the FlashInfer workspace and the prefill / decode wrapper(s) of one device."""

    def __init__(
        self,
        device: torch.device | str,
        workspace_bytes: int = 128 * 1024 * 1024,
        use_cuda_graph: bool = False,
        max_batch_size: int = 0,        # graph mode: largest captured batch size
        max_kv_tokens: int = 0,         # graph mode: capacity of the kv_indices buffer
        prefill_backend: str = "fa2",   # fa2 | fa3 | auto (bench.py times both on Hopper)
        decode_tensor_cores: bool | None = None,   # None: from the group size (TENSOR_CORE_MIN_GROUP)
    ) -> None:
        import flashinfer   # absent flashinfer fails here, not on import

        self._prefill_cls = flashinfer.BatchPrefillWithPagedKVCacheWrapper
        self._decode_cls = flashinfer.BatchDecodeWithPagedKVCacheWrapper
        self.device = torch.device(device)
        self.use_cuda_graph = use_cuda_graph
        self.prefill_backend = prefill_backend
        self.decode_tensor_cores = decode_tensor_cores
        self.workspace = torch.zeros(workspace_bytes, dtype=torch.uint8, device=self.device)
        self._prefill = None            # built on first extend (eager only)
        self._decode: dict[tuple[int, bool], object] = {}   # (batch size or 0 when eager, tensor cores)
        if use_cuda_graph:
            assert max_batch_size > 0 and max_kv_tokens > 0, "graph mode needs fixed buffer sizes"
            int32 = dict(dtype=torch.int32, device=self.device)
            self._kv_indptr_buf = torch.zeros(max_batch_size + 1, **int32)      # [B_max + 1]
            self._kv_indices_buf = torch.zeros(max_kv_tokens, **int32)          # [K_max]
            self._last_page_len_buf = torch.ones(max_batch_size, **int32)       # [B_max], page size 1
        self._ones_cpu = torch.ones(max(max_batch_size, 1), dtype=torch.int32)  # last-page lengths (host)
        self._active = None
        self._fence = PlanFence()                        # see kernels/plan_fence.py

    # -- wrappers ----------------------------------------------------------------------------
    def _decode_wrapper(self, batch_size: int, tensor_cores: bool):
        key = (batch_size if self.use_cuda_graph else 0, tensor_cores)
        if key not in self._decode:
            if self.use_cuda_graph:
                assert batch_size < self._kv_indptr_buf.numel(), "batch larger than max_batch_size"
                self._decode[key] = self._decode_cls(
                    self.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores,
                    paged_kv_indptr_buffer=self._kv_indptr_buf[:batch_size + 1],
                    paged_kv_indices_buffer=self._kv_indices_buf,
                    paged_kv_last_page_len_buffer=self._last_page_len_buf[:batch_size])
            else:
                self._decode[key] = self._decode_cls(self.workspace, "NHD", use_tensor_cores=tensor_cores)
        return self._decode[key]

    def _prefill_wrapper(self):
        if self.use_cuda_graph:
            raise ValueError("graph-mode FlashInferGQA runs decode batches only (one new token per sequence)")
        if self._prefill is None:
            self._prefill = self._prefill_cls(self.workspace, "NHD", backend=self.prefill_backend)
        return self._prefill

    def uses_tensor_cores(self, num_heads: int, num_kv_heads: int) -> bool:
        if self.decode_tensor_cores is not None:
            return self.decode_tensor_cores
        return num_heads // num_kv_heads >= TENSOR_CORE_MIN_GROUP

    # -- one step --------------------------------------------------------------------------
    def plan(
        self,
        qo_indptr: torch.Tensor,        # [B + 1] int (CPU)
        kv_indptr: torch.Tensor,        # [B + 1] int (CPU)
        kv_indices: torch.Tensor,       # [sum L] int32 slots (device)
        kv_lens: torch.Tensor | None,   # [B] int (CPU); None: from kv_indptr
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        sm_scale: float,
        q_dtype: torch.dtype,
        kv_dtype: torch.dtype,
        causal: bool = True,
    ) -> None:
        """Schedule one forward step; every run() until the next plan() uses it."""
        qo_indptr = qo_indptr.to(torch.int32)
        kv_indptr = kv_indptr.to(torch.int32)
        kv_lens = (kv_indptr[1:] - kv_indptr[:-1] if kv_lens is None else kv_lens).to(torch.int32)
        kv_indices = kv_indices.to(device=self.device, dtype=torch.int32)
        batch_size = qo_indptr.numel() - 1
        self._fence.wait()
        last_page_len = self._last_page_lens(batch_size)
        if bool(torch.all(qo_indptr[1:] - qo_indptr[:-1] == 1)):              # decode: one query per sequence
            wrapper = self._decode_wrapper(batch_size, self.uses_tensor_cores(num_heads, num_kv_heads))
            wrapper.plan(kv_indptr, kv_indices, last_page_len, num_heads, num_kv_heads, head_dim, _PAGE_SIZE,
                         q_data_type=q_dtype, kv_data_type=kv_dtype, sm_scale=sm_scale, seq_lens=kv_lens)
        else:
            wrapper = self._prefill_wrapper()
            wrapper.plan(qo_indptr, kv_indptr, kv_indices, last_page_len, num_heads, num_kv_heads, head_dim,
                         _PAGE_SIZE, causal=causal, sm_scale=sm_scale, q_data_type=q_dtype,
                         kv_data_type=kv_dtype, seq_lens=kv_lens)
        self._active = wrapper
        self._fence.mark()

    def _last_page_lens(self, batch_size: int) -> torch.Tensor:   # [B] int32 CPU, all 1 (page size 1)
        if batch_size > self._ones_cpu.numel():
            self._ones_cpu = torch.ones(batch_size, dtype=torch.int32)
        return self._ones_cpu[:batch_size]

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            out: torch.Tensor | None = None) -> torch.Tensor:
        """q [T, N, D]; k_cache [S, Hkv, D], v_cache [S, Hkv, Dv] (one layer of the pool) -> [T, N, Dv]."""
        assert self._active is not None, "call plan() first"
        paged = (k_cache.unsqueeze(1), v_cache.unsqueeze(1))                  # [S, 1, Hkv, D]: pages of one slot
        return self._active.run(q, paged, out=out)


def flashinfer_available() -> bool:
    """True when flashinfer imports (it may still need a GPU and JIT-compiles at first use)."""
    try:
        import flashinfer  # noqa: F401
    except Exception:  # ImportError, or a broken CUDA setup raising at import
        return False
    return True
