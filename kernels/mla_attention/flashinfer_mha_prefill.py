"""FlashInfer causal ragged prefill for MLA in MHA form (SGLang's "MLA prefill as MHA"): q/k of Dqk = qk_nope
+ rope dims, v of Dv, N heads on both sides, k/v expanded from the latents by kv_b_proj.

Legend: B = sequences, T = new tokens, K = attended tokens (prefix + new), N = heads, Dqk / Dv = head dims.

Versions: v1 (this file) wraps flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper (FlashInfer 0.5; on
Hopper it picks the FA3 kernels, which are compiled for (Dqk, Dv) = (192, 128), DeepSeek's dims).
flashinfer is imported inside FlashInferMHAPrefill.__init__ only: importing this module never needs it.

    prefill = FlashInferMHAPrefill(device, workspace)   # may share FlashInferMLA's float workspace: the
    prefill.plan(qo_indptr, kv_indptr, ...)             # runtime runs one of the two per step
    for layer in layers:                                # ONCE per step (host work), then per layer:
        out = prefill.run(q, k, v)                      # [T, N, Dv], no host work
qo_indptr / kv_indptr: int32 CPU tensors (FlashInfer plans on the host). k/v rows follow kv_indptr: each
sequence's prefix then its new tokens; causal is bottom-right aligned (new token i of a sequence with q_len
new and kv_len attended tokens sees the first kv_len - q_len + i + 1). q, k, v may be strided views (last
dim contiguous): v as the slice of kv_b_proj's output needs no copy.
"""
from __future__ import annotations

import torch

from kernels.plan_fence import PlanFence


class FlashInferMHAPrefill:
    """Owns one ragged prefill wrapper (eager use only: its schedule changes every step)."""

    def __init__(self, device: torch.device | str, workspace: torch.Tensor | None = None,
                 workspace_bytes: int = 128 * 1024 * 1024, backend: str = "auto") -> None:
        from flashinfer.prefill import BatchPrefillWithRaggedKVCacheWrapper   # absent flashinfer fails here

        self.device = torch.device(device)
        if workspace is None:
            workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=self.device)
        self.workspace = workspace
        self._wrapper = BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend=backend)
        self._fence = PlanFence()                        # see kernels/plan_fence.py
        self._dims: tuple[int, int, int] | None = None   # (N, Dqk, Dv) of the last plan

    def plan(
        self,
        qo_indptr: torch.Tensor,   # [B + 1] int32 CPU
        kv_indptr: torch.Tensor,   # [B + 1] int32 CPU
        num_heads: int,
        head_dim_qk: int,
        head_dim_vo: int,
        sm_scale: float,
        dtype: torch.dtype,
        causal: bool = True,
    ) -> None:
        """Schedule one forward step; every run() until the next plan() uses it."""
        self._fence.wait()
        self._wrapper.plan(qo_indptr.to(torch.int32), kv_indptr.to(torch.int32), num_heads, num_heads,
                           head_dim_qk, head_dim_vo=head_dim_vo, causal=causal, sm_scale=sm_scale,
                           q_data_type=dtype, kv_data_type=dtype)
        self._fence.mark()
        self._dims = (num_heads, head_dim_qk, head_dim_vo)

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            out: torch.Tensor | None = None) -> torch.Tensor:   # [T, N, Dqk], [K, N, Dqk], [K, N, Dv] -> [T, N, Dv]
        assert self._dims is not None, "call plan() first"
        assert (q.shape[1], q.shape[2], v.shape[2]) == self._dims, "q/v shapes differ from plan()"
        return self._wrapper.run(q, k, v, out=out)

