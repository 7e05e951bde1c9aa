"""DeepSeek multi-head latent attention over a latent KV pool, in the form SGLang picks per step
(runtime.core.mla_form): weight-absorbed (decode, extends over a short cached prefix) or MHA (prefills).

Legend: T = new tokens, K = attended tokens (prefix + new), H = hidden, N = heads, Dn = qk_nope_head_dim,
R = qk_rope_head_dim, Dv = v_head_dim, C = kv_lora_rank, Q = q_lora_rank. The pool keeps one [c_kv | k_pe]
per token in both forms; kv_b_proj [N * (Dn + Dv), C] expands latents in MHA form, and is split once after
loading into W_UK [N, Dn, C] and W_UV [N, Dv, C] for the absorbed form.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from runtime.distributed.layers import shard_mla_heads
from runtime.distributed.sharding import SINGLE, ModelParallel
from runtime.models.config import ModelConfig
from runtime.models.layers import Linear, RMSNorm, SmallOps
from runtime.models.rotary import apply_rotary, yarn_softmax_mscale

if TYPE_CHECKING:
    from runtime.models.base import StepContext

_LORA_NORM_EPS = 1e-6   # HF and DeepSeek build q_a/kv_a_layernorm with the default eps


class MLAttention(nn.Module):
    """q (direct or through the q LoRA), the shared latent c_kv and rope key k_pe, then either
    absorbed: score = (q_nope W_UK) . c_kv + q_pe . k_pe; out = (probs @ c_kv) W_UV, or
    MHA form: [k_nope | v] = kv_b_proj(c_kv) per head; score = q_nope . k_nope + q_pe . k_pe; out = probs @ v.
    The two are the same function (tests check it); MHA form costs ~1/3 of the FLOPs per attended pair
    but expands every attended token, so it pays off for prefills."""

    def __init__(self, config: ModelConfig, layer_id: int, dtype: torch.dtype, device: torch.device | str,
                 parallel: ModelParallel = SINGLE):
        super().__init__()
        self.layer_id = layer_id
        hidden, n = config.hidden_size, parallel.local_heads(config.num_attention_heads)   # N: this rank's heads
        self.num_heads, self.kv_lora_rank = n, config.kv_lora_rank
        self.nope_dim, self.rope_dim, self.v_dim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        self.interleaved = config.rope.interleaved
        qk_dim = self.nope_dim + self.rope_dim
        bias = config.attention_bias
        if config.q_lora_rank is None:
            self.q_proj = Linear(hidden, n * qk_dim, False, dtype, device)
        else:
            self.q_a_proj = Linear(hidden, config.q_lora_rank, bias, dtype, device)
            self.q_a_layernorm = RMSNorm(config.q_lora_rank, _LORA_NORM_EPS, dtype, device)
            self.q_b_proj = Linear(config.q_lora_rank, n * qk_dim, False, dtype, device)
        self.kv_a_proj_with_mqa = Linear(hidden, self.kv_lora_rank + self.rope_dim, bias, dtype, device)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, _LORA_NORM_EPS, dtype, device)
        self.kv_b_proj = Linear(self.kv_lora_rank, n * (self.nope_dim + self.v_dim), False, dtype, device)
        self.o_proj = Linear(n * self.v_dim, hidden, bias, dtype, device)
        self.scale = qk_dim ** -0.5 * yarn_softmax_mscale(config.rope, config.max_position_embeddings)
        self.register_buffer("w_uk", None, persistent=False)   # [N, Dn, C]
        self.register_buffer("w_uv", None, persistent=False)   # [N, Dv, C]
        self.input_proj_weight: torch.Tensor | None = None     # [N*(Dn+R) or Q, H] over [C + R, H] (fuse_input_projections)
        if parallel.sharded:   # heads split (q, kv_b column-, o row-parallel); the latent path is replicated
            shard_mla_heads(self, parallel, config.num_attention_heads)

    def post_load(self) -> None:
        """Split kv_b_proj into the absorption matrices (after weights are in place)."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope_dim + self.v_dim, self.kv_lora_rank)
        self.w_uk = w[:, :self.nope_dim].contiguous()
        self.w_uv = w[:, self.nope_dim:].contiguous()

    @torch.no_grad()
    def fuse_input_projections(self) -> bool:
        """Stack the two projections that read the layer input -- q_proj (q_a_proj with the q LoRA) and
        kv_a_proj_with_mqa -- into one weight, so the fused path runs one GEMM for both (SGLang's
        fused_qkv_a_proj_with_mqa). Both Linears keep views of its rows (no second copy; the reference path
        reads the same values). Bias-free projections only; run after loading. Returns whether it fused."""
        first = self.q_proj if hasattr(self, "q_proj") else self.q_a_proj
        kv_a = self.kv_a_proj_with_mqa
        if self.input_proj_weight is not None or first.bias is not None or kv_a.bias is not None:
            return False
        stacked = torch.cat([first.weight.data, kv_a.weight.data])                 # [Nq + C + R, H]
        rows = first.weight.shape[0]
        first.weight = nn.Parameter(stacked[:rows], requires_grad=False)
        kv_a.weight = nn.Parameter(stacked[rows:], requires_grad=False)
        self.input_proj_weight = stacked
        return True

    def _project_input(self, x: torch.Tensor, ops: SmallOps) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> q [T, N, Dn + R] (pe not rotated), latent [T, C + R]: one GEMM when the input projections
        are stacked (both results are row-strided views of its output), else two."""
        if self.input_proj_weight is None:
            return self._query(x, ops), self.kv_a_proj_with_mqa(x)
        both = torch.nn.functional.linear(x, self.input_proj_weight)             # [T, Nq + C + R]
        split = both.shape[1] - (self.kv_lora_rank + self.rope_dim)
        head, latent = both[:, :split], both[:, split:]
        if not hasattr(self, "q_proj"):
            head = self.q_b_proj(ops.rmsnorm(head, self.q_a_layernorm))
        return head.view(x.shape[0], self.num_heads, self.nope_dim + self.rope_dim), latent

    def _query(self, x: torch.Tensor, ops: SmallOps | None = None) -> torch.Tensor:   # [T, H] -> [T, N, Dn + R]
        if hasattr(self, "q_proj"):
            q = self.q_proj(x)
        elif ops is None:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        else:
            q = self.q_b_proj(ops.rmsnorm(self.q_a_proj(x), self.q_a_layernorm))
        return q.view(x.shape[0], self.num_heads, self.nope_dim + self.rope_dim)

    def forward(self, x: torch.Tensor, ctx: "StepContext") -> torch.Tensor:   # [T, H] -> [T, H]
        if ctx.ops is not None:
            return self._forward_fused(x, ctx, ctx.ops)
        q_nope, q_pe = self._query(x).split([self.nope_dim, self.rope_dim], dim=-1)
        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        c_kv = self.kv_a_layernorm(c_kv)                                  # [T, C]
        q_pe = apply_rotary(q_pe, ctx.cos, ctx.sin, self.interleaved)     # [T, N, R]
        k_pe = apply_rotary(k_pe, ctx.cos, ctx.sin, self.interleaved)     # [T, R]
        if ctx.backend.mla_as_mha(ctx.fb):
            heads = self._attend_as_mha(torch.cat([q_nope, q_pe], dim=-1), c_kv, k_pe, ctx)   # [T, N, Dv]
            return self.o_proj(heads.reshape(x.shape[0], -1))
        q_latent = torch.einsum("tnd,ndc->tnc", q_nope, self.w_uk)        # [T, N, C]
        out = ctx.backend.mla(self.layer_id, q_latent, q_pe, c_kv, k_pe, ctx.fb, ctx.pool, self.scale)
        out = torch.einsum("tnc,nvc->tnv", out, self.w_uv)                # [T, N, Dv]
        return self.o_proj(out.reshape(x.shape[0], -1))

    def _forward_fused(self, x: torch.Tensor, ctx: "StepContext", ops: SmallOps) -> torch.Tensor:
        """The same math in fewer launches: one rotary kernel for q and k (q's rope part lands in a
        contiguous buffer, as the attention kernels want it), and the absorption bmms read strided
        views and write head-major views of token-major buffers, so no copy surrounds them.
        Everything up to the rotated inputs has static shapes; `_attend_fused` (the KV store and the
        attention in the form the step is planned in) runs through ctx.run_attention, where piecewise
        CUDA graphs split the layer."""
        num_tokens, n = x.shape[0], self.num_heads
        q, latent = self._project_input(x, ops)                            # [T, N, Dn + R] pe not rotated, [T, C + R]
        c_kv = ops.rmsnorm(latent[:, :self.kv_lora_rank], self.kv_a_layernorm)   # [T, C]
        k_pe = latent[:, self.kv_lora_rank:]                               # [T, R], rotated in place
        q_pe = x.new_empty(num_tokens, n, self.rope_dim)                   # [T, N, R]
        ops.rope(ctx.fb.positions, q[..., self.nope_dim:], k_pe, self.interleaved, q_out=q_pe)
        heads = ctx.run_attention(self._attend_fused, (n, self.v_dim), q, q_pe, c_kv, k_pe)   # [T, N, Dv]
        return self.o_proj(heads.reshape(num_tokens, -1))

    def _attend_fused(self, q: torch.Tensor, q_pe: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor,
                      ctx: "StepContext") -> torch.Tensor:
        """[T, N, Dn + R] (pe part not rotated), [T, N, R] rotated, [T, C], [T, R] rotated -> [T, N, Dv]."""
        num_tokens, n = q.shape[0], self.num_heads
        if ctx.backend.mla_as_mha(ctx.fb):
            q = q.contiguous()                                             # a view of the stacked GEMM's rows
            q[..., self.nope_dim:].copy_(q_pe)                             # q = [q_nope | rotated q_pe]
            return self._attend_as_mha(q, c_kv, k_pe, ctx)
        q_latent = q.new_empty(num_tokens, n, self.kv_lora_rank)           # [T, N, C]
        torch.bmm(q[..., :self.nope_dim].transpose(0, 1), self.w_uk, out=q_latent.transpose(0, 1))
        out = ctx.backend.mla(self.layer_id, q_latent, q_pe, c_kv, k_pe, ctx.fb, ctx.pool, self.scale)
        heads = q.new_empty(num_tokens, n, self.v_dim)                     # [T, N, Dv]
        torch.bmm(out.transpose(0, 1), self.w_uv.transpose(1, 2), out=heads.transpose(0, 1))
        return heads

    def _attend_as_mha(self, q: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor,
                       ctx: "StepContext") -> torch.Tensor:   # [T, N, Dn + R], [T, C], [T, R] -> [T, N, Dv]
        """Store the new latents (decode reads them), expand every attended token's latent through
        kv_b_proj -- the new tokens' own, or, when a prefix is attended too, all of them read back from
        the pool -- and attend causally over per-head k = [k_nope | k_pe] and v."""
        fb, n, dn = ctx.fb, self.num_heads, self.nope_dim
        ctx.backend.mla_store(self.layer_id, c_kv, k_pe, fb, ctx.pool)
        if any(fb.prefix_lens_cpu):
            latent = ctx.pool.get_kv(self.layer_id)[fb.kv_indices]         # [K, C + R]
            c_kv, k_pe = latent[:, :self.kv_lora_rank], latent[:, self.kv_lora_rank:]
        kv = self.kv_b_proj(c_kv).view(c_kv.shape[0], n, dn + self.v_dim)  # [K, N, Dn + Dv]
        # k_nope and v stay strided views of kv; the backend lays k = [k_nope | k_pe] out as its kernel needs
        return ctx.backend.mla_mha(self.layer_id, q, kv[..., :dn], k_pe, kv[..., dn:], fb, self.scale)
