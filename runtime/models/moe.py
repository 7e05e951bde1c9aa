"""Mixture of experts: router (softmax/sigmoid, greedy or group-limited top-k), stacked experts computed
through a swappable fused-MoE function, and shared experts (DeepSeek plain, Qwen2-MoE sigmoid-gated).

Legend: T = tokens, H = hidden, I = expert intermediate, E = experts, K = experts per token, G = groups.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from kernels.fused_moe.ref import fused_moe_ref
from runtime.core.fusion_limits import ROUTER_KERNEL_MAX_TOKENS, STACKED_SHARED_MAX_TOKENS
from runtime.distributed.layers import local_expert_routing
from runtime.distributed.sharding import SINGLE, ModelParallel, Piece, Split, annotate, shard_spec
from runtime.models.config import ModelConfig
from runtime.models.layers import GatedMLP, Linear, SmallOps, empty_param

# (hidden [T, H], w13 [E, 2I, H], w2 [E, H, I], topk_weights [T, K], topk_ids [T, K]) -> [T, H]
MoEFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def append_shared_pairs(topk_weights: torch.Tensor, topk_ids: torch.Tensor, first_shared: int, num_shared: int,
                        gate_logit: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, K] routing -> [T, K + S]: every token also takes experts first_shared..first_shared+S-1 (shared
    experts stacked after the routed ones), weighted 1, or sigmoid(gate_logit [T, 1]) (Qwen2-MoE's gate)."""
    num_tokens = topk_ids.shape[0]
    ids = torch.arange(first_shared, first_shared + num_shared, device=topk_ids.device, dtype=topk_ids.dtype)
    if gate_logit is None:
        weights = topk_weights.new_ones(num_tokens, num_shared)
    else:
        weights = torch.sigmoid(gate_logit.float()).expand(num_tokens, num_shared)
    return torch.cat([topk_weights, weights], dim=1), torch.cat([topk_ids, ids.expand(num_tokens, num_shared)], dim=1)


def select_experts(
    logits: torch.Tensor,                 # [T, E] float32 router logits
    top_k: int,
    scoring_func: str = "softmax",        # softmax | sigmoid
    topk_method: str = "greedy",          # greedy | group_limited_greedy | noaux_tc
    n_group: int = 1,
    topk_group: int = 1,
    norm_topk_prob: bool = False,
    routed_scaling_factor: float = 1.0,
    correction_bias: torch.Tensor | None = None,  # [E], noaux_tc: added for the choice only
) -> tuple[torch.Tensor, torch.Tensor]:   # topk_weights [T, K] float32, topk_ids [T, K] long
    """Top-k experts per token as DeepSeek-V2/V3 and Qwen2-MoE route: choose on (biased) scores,
    optionally only inside the best groups; weight by the unbiased scores, renormalised and scaled."""
    if scoring_func == "softmax":
        scores = logits.softmax(dim=-1)
    elif scoring_func == "sigmoid":
        scores = logits.sigmoid()
    else:
        raise NotImplementedError(f"scoring_func {scoring_func!r}")
    choice = scores if correction_bias is None else scores + correction_bias.float()
    if topk_method == "group_limited_greedy" and n_group > 1:
        # DeepSeek-V2: experts outside the kept groups score 0 and weigh 0, also when top_k exceeds
        # what the kept groups hold (HF DeepseekV2MoEGate, SGLang grouped_topk)
        scores = _mask_to_best_groups(scores, n_group, topk_group, by_top2_sum=False, fill=0.0)
        choice = scores
    elif topk_method == "noaux_tc" and n_group > 1:
        choice = _mask_to_best_groups(choice, n_group, topk_group, by_top2_sum=True)
    elif topk_method not in ("greedy", "group_limited_greedy", "noaux_tc"):
        raise NotImplementedError(f"topk_method {topk_method!r}")
    topk_ids = torch.topk(choice, k=top_k, dim=-1, sorted=False).indices   # [T, K]
    topk_weights = scores.gather(1, topk_ids)                               # unbiased scores
    if norm_topk_prob:
        topk_weights = topk_weights / (topk_weights.sum(dim=-1, keepdim=True) + 1e-20)
    if routed_scaling_factor == 1.0:
        return topk_weights, topk_ids         # x * 1.0 == x: skip a launch, bit-identical
    return topk_weights * routed_scaling_factor, topk_ids


def _mask_to_best_groups(choice: torch.Tensor, n_group: int, topk_group: int,
                         by_top2_sum: bool, fill: float = float("-inf")) -> torch.Tensor:
    """Keep the experts of the topk_group best groups (group score: max, or sum of the top 2 for
    noaux_tc); the others get `fill` (-inf: top-k never picks them while kept experts remain)."""
    num_tokens, num_experts = choice.shape
    grouped = choice.view(num_tokens, n_group, num_experts // n_group)          # [T, G, E/G]
    group_scores = grouped.topk(2, dim=-1).values.sum(-1) if by_top2_sum else grouped.max(-1).values
    best = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False).indices  # [T, topk_group]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    return grouped.masked_fill(~keep[:, :, None], fill).view(num_tokens, num_experts)


class TopKRouter(nn.Module):
    """Router weight [E, H] (HF `mlp.gate.weight`) plus DeepSeek-V3's e_score_correction_bias [E]
    (kept float32). Logits are computed in float32."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        self.config = config
        self.weight = empty_param(config.num_experts, config.hidden_size, dtype=dtype, device=device)
        self.e_score_correction_bias = (
            empty_param(config.num_experts, dtype=torch.float32, device=device)
            if config.topk_method == "noaux_tc" else None)
        self._weight_f32: torch.Tensor | None = None   # float32 copy for the fused path (no cast per step)

    def post_load(self) -> None:
        self._weight_f32 = None                        # weights changed: rebuild the copy on next use

    def weight_f32(self) -> torch.Tensor:
        """[E, H] float32 copy of the weight, made once (the fast path makes it before any graph capture)."""
        if self._weight_f32 is None:
            self._weight_f32 = self.weight.float()
        return self._weight_f32

    def forward(self, x: torch.Tensor, cached_f32: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """cached_f32: read a float32 copy of the weight kept across steps (the same values as the
        per-step cast); the fused path uses it, the reference casts each step."""
        if cached_f32:
            logits = x.float() @ self.weight_f32().t()                      # [T, E]
        else:
            logits = x.float() @ self.weight.float().t()                    # [T, E]
        return self.select(logits)

    def select(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k of float32 router logits [T, E] (rows may be strided) as this router's config chooses."""
        cfg = self.config
        return select_experts(
            logits, cfg.num_experts_per_tok, cfg.scoring_func, cfg.topk_method, cfg.n_group,
            cfg.topk_group, cfg.norm_topk_prob, cfg.routed_scaling_factor, self.e_score_correction_bias)


class StackedExperts(nn.Module):
    """The routed experts of a layer this rank holds: w13 [E, 2I, H] (gate rows then up rows), w2 [E, H, I].
    Sharded (`parallel`): E = num_experts / ep whole experts starting at `first_expert`, each with
    I = moe_intermediate_size / (tp / ep) of its intermediate dim."""

    def __init__(self, num_experts: int, hidden: int, inter: int,
                 dtype: torch.dtype, device: torch.device | str, parallel: ModelParallel = SINGLE):
        super().__init__()
        self.num_local = num_experts // parallel.ep_size
        self.first_expert = parallel.ep_rank * self.num_local
        self.inter_piece = Piece(inter, parallel.moe_tp_size, parallel.moe_tp_rank)
        self.inter = inter = self.inter_piece.local_size
        self.w13 = empty_param(self.num_local, 2 * inter, hidden, dtype=dtype, device=device)
        self.w2 = empty_param(self.num_local, hidden, inter, dtype=dtype, device=device)
        experts = Split(0, (Piece(num_experts, parallel.ep_size, parallel.ep_rank),))
        piece = self.inter_piece
        annotate(self.w13, experts, Split(1, (piece, piece)))
        annotate(self.w2, experts, Split(2, (piece,)))

    def global_ids(self) -> range:
        """The experts (model-wide ids) this rank holds."""
        return range(self.first_expert, self.first_expert + self.num_local)

    def load_hf(self, proj: str, expert: int | None, tensor: torch.Tensor) -> str | None:
        """Copy an HF expert tensor in (this rank's share of it); returns the name of the parameter it
        filled, or None for an expert another rank holds. Per expert (expert given): gate_proj/up_proj
        [I, H], down_proj [H, I]. Fused (expert None): gate_up_proj [E, 2I, H] or [E, H, 2I], down_proj
        [E, H, I] or [E, I, H]."""
        inter = self.inter
        per_expert = expert is not None and proj in ("gate_proj", "up_proj", "down_proj")
        fused = expert is None and proj in ("gate_up_proj", "down_proj")
        if not (per_expert or fused):
            raise ValueError(f"unsupported expert tensor form: {proj} (expert {expert})")
        if expert is not None:
            if expert not in self.global_ids():
                return None
            expert -= self.first_expert
            piece = self.inter_piece
            if piece.pieces > 1:   # this rank's rows of gate/up, columns of down
                dim = 1 if proj == "down_proj" else 0
                tensor = tensor.narrow(dim, piece.index * piece.local_size, piece.local_size)
            target = {"gate_proj": self.w13[expert, :inter], "up_proj": self.w13[expert, inter:],
                      "down_proj": self.w2[expert]}[proj]
            if tensor.shape != target.shape:
                raise ValueError(f"expert {expert} {proj} shape {tuple(tensor.shape)} != {tuple(target.shape)}")
            target.copy_(tensor)
            return "w13" if proj != "down_proj" else "w2"
        target = self.w13 if proj == "gate_up_proj" else self.w2
        spec = shard_spec(target)
        full_shape = spec.full_shape(target.shape) if spec is not None else target.shape
        if tensor.shape != full_shape and tensor.transpose(1, 2).shape == full_shape:
            tensor = tensor.transpose(1, 2)   # stored [E, in, out]; square shapes read as [E, out, in]
        if tensor.shape != full_shape:
            raise ValueError(f"expert {proj} shape {tuple(tensor.shape)} != {tuple(full_shape)}")
        target.copy_(spec.narrow(tensor) if spec is not None else tensor)
        return "w13" if proj == "gate_up_proj" else "w2"


class MoE(nn.Module):
    """Routed experts + optional shared experts. `experts_fn` is the fused-MoE compute (torch ref by
    default; the Triton kernel plugs in with the same signature). Sharded (`parallel`): the router is
    whole on every rank, the routed experts are this rank's (runtime.distributed.layers.local_expert_routing
    drops other ranks' pairs), shared experts are split tp ways like a dense MLP (each token's shared
    expert computed once over the group); the output is a partial sum the decoder layer all-reduces.
    `fuse_shared_experts()` (the fast path, one rank) stacks the shared experts after the routed ones, so
    one fused-MoE call computes both (SGLang's shared-experts fusion)."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device | str,
                 experts_fn: MoEFn = fused_moe_ref, parallel: ModelParallel = SINGLE):
        super().__init__()
        hidden = config.hidden_size
        self.gate = TopKRouter(config, dtype, device)
        self.experts = StackedExperts(config.num_experts, hidden, config.moe_intermediate_size, dtype, device,
                                      parallel)
        self.expert_parallel = parallel.ep_size > 1
        self.sharded = parallel.sharded
        self.experts_fn = experts_fn
        self.shared_experts = self.shared_expert = self.shared_expert_gate = None
        if config.n_shared_experts:            # DeepSeek: added as is
            self.shared_experts = GatedMLP(hidden, config.moe_intermediate_size * config.n_shared_experts,
                                           config.mlp_bias, dtype, device, parallel)
        if config.shared_expert_intermediate_size:  # Qwen2-MoE: scaled by sigmoid(gate x)
            self.shared_expert = GatedMLP(hidden, config.shared_expert_intermediate_size, False, dtype, device,
                                          parallel)
            self.shared_expert_gate = Linear(hidden, 1, False, dtype, device)
        self.num_fused_shared = 0              # S shared experts stacked as experts E..E+S-1 (fuse_shared_experts)
        self._fused_router_weight: torch.Tensor | None = None   # fast path: router (+ shared gate) in float32
        self._router_rows: torch.Tensor | None = None           # the same rows in the weights' dtype (route kernel)

    def forward(self, x: torch.Tensor, ops: SmallOps | None = None) -> torch.Tensor:   # [T, H] -> [T, H]
        if ops is not None:
            return self._forward_fused(x, ops)
        topk_weights, topk_ids = self.gate(x)                    # [T, K], [T, K]
        if self.expert_parallel:
            topk_weights, topk_ids = self._local_routing(topk_weights, topk_ids)
        if self.num_fused_shared:
            gate_logit = self.shared_expert_gate(x) if self.shared_expert_gate is not None else None
            topk_weights, topk_ids = append_shared_pairs(topk_weights, topk_ids, self.experts.num_local,
                                                         self.num_fused_shared, gate_logit)
            return self.experts_fn(x, self.experts.w13, self.experts.w2, topk_weights, topk_ids)
        out = self.experts_fn(x, self.experts.w13, self.experts.w2, topk_weights, topk_ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out

    def _forward_fused(self, x: torch.Tensor, ops: SmallOps) -> torch.Tensor:
        """Same sum in fewer launches. Steps of up to ROUTER_KERNEL_MAX_TOKENS tokens route in two kernels
        (ops.route: logits, scores, top-k, and the stacked shared experts' pairs); otherwise the router reads
        its cached float32 weight (Qwen2-MoE's shared-expert gate is one more row of either). Stacked shared
        experts run inside the fused MoE up to STACKED_SHARED_MAX_TOKENS tokens; past that (where one grouped
        GEMM over T rows per shared expert is slower than dense GEMMs), and when not stacked, the shared MLP
        adds into the routed output inside its down GEMM (experts_fn must return a fresh tensor), its gate's
        sigmoid scaling the activation (down is linear without bias)."""
        num_tokens, gated = x.shape[0], self.shared_expert_gate is not None
        stacked = self.num_fused_shared if num_tokens <= STACKED_SHARED_MAX_TOKENS else 0
        if num_tokens <= ROUTER_KERNEL_MAX_TOKENS and ops.routes_few_tokens and self.routes_with_kernel():
            cfg, num_experts = self.gate.config, self.gate.weight.shape[0]
            topk_weights, topk_ids, logits = ops.route(
                x, self.router_rows(), num_experts, cfg.num_experts_per_tok, cfg.scoring_func,
                cfg.norm_topk_prob, cfg.routed_scaling_factor, stacked, gated)
            gate_logit = logits[:, num_experts:] if gated else None                # [T, 1] float32
        else:
            gate_logit = None
            if not gated:
                topk_weights, topk_ids = self.gate(x, cached_f32=True)             # [T, K], [T, K]
            else:
                logits = x.float() @ self.fused_router_weight().t()                # [T, E + 1]
                num_experts = self.gate.weight.shape[0]                            # all experts (router rows)
                topk_weights, topk_ids = self.gate.select(logits[:, :num_experts])
                gate_logit = logits[:, num_experts:]                               # [T, 1] float32
            if self.expert_parallel:
                topk_weights, topk_ids = self._local_routing(topk_weights, topk_ids)
            if stacked:
                topk_weights, topk_ids = append_shared_pairs(topk_weights, topk_ids, self.experts.num_local,
                                                             stacked, gate_logit)
        out = self.experts_fn(x, self.experts.w13, self.experts.w2, topk_weights, topk_ids)
        if stacked:
            return out
        if self.num_fused_shared:
            return self._stacked_shared_add(x, out, ops, gate_logit)
        if self.shared_experts is not None:
            out = self.shared_experts.forward_add(x, out, ops)
        if self.shared_expert is not None:
            out = self.shared_expert.forward_add_gated(x, out, ops, gate_logit)
        return out

    def _stacked_shared_add(self, x: torch.Tensor, out: torch.Tensor, ops: SmallOps,
                            gate_logit: torch.Tensor | None) -> torch.Tensor:
        """out + the shared MLP of x, as dense GEMMs over the stacked experts' rows (no second copy of the
        weights): w13[E:] [S, 2I, H] is one [S*2I, H] weight whose output [T, S*2I] is S (gate | up) blocks,
        i.e. [T*S, 2I] rows for one SiLU-and-mul; then one down GEMM per piece adds into out."""
        num_tokens, first, pieces, inter = x.shape[0], self.experts.num_local, self.num_fused_shared, self.experts.inter
        w13, w2 = self.experts.w13[first:], self.experts.w2[first:]               # [S, 2I, H], [S, H, I]
        gate_up = torch.nn.functional.linear(x, w13.reshape(pieces * 2 * inter, -1))   # [T, S*2I]
        rows = gate_up.view(num_tokens * pieces, 2 * inter)                        # [T*S, 2I]
        if gate_logit is None:
            act = ops.silu_and_mul(rows)                                           # [T*S, I]
        else:
            act = ops.silu_and_mul_gated(rows, gate_logit.repeat_interleave(pieces, dim=0))
        act = act.view(num_tokens, pieces * inter)                                 # [T, S*I]
        for piece in range(pieces):
            out.addmm_(act[:, piece * inter:(piece + 1) * inter], w2[piece].t())
        return out

    def routes_with_kernel(self) -> bool:
        """Whether SmallOps.route can route this layer: greedy choice on softmax/sigmoid scores without a
        correction bias, one rank's experts (no EP re-mapping), at most 256 router rows."""
        cfg = self.gate.config
        greedy = cfg.topk_method == "greedy" or (cfg.topk_method == "group_limited_greedy" and cfg.n_group <= 1)
        rows = self.gate.weight.shape[0] + (1 if self.shared_expert_gate is not None else 0)
        return (greedy and self.gate.e_score_correction_bias is None and not self.expert_parallel
                and cfg.scoring_func in ("softmax", "sigmoid") and rows <= 256)

    def _local_routing(self, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return local_expert_routing(topk_weights, topk_ids, self.experts.first_expert, self.experts.num_local)

    def fused_router_weight(self) -> torch.Tensor:
        """[E (+1), H] float32, made once: the router weight, plus Qwen2-MoE's shared-expert gate row (the
        fast path makes it before any graph capture; rebuilt after a weight load)."""
        if self._fused_router_weight is None:
            weight = self.gate.weight_f32()
            if self.shared_expert_gate is not None:
                weight = torch.cat([weight, self.shared_expert_gate.weight.float()], dim=0)
            self._fused_router_weight = weight
        return self._fused_router_weight

    def router_rows(self) -> torch.Tensor:
        """[E (+1), H] in the weights' dtype, made once: the router rows and the shared-expert gate row, as the
        route kernel reads them (it multiplies in float32: the same products as the float32 copy)."""
        if self._router_rows is None:
            rows = self.gate.weight
            if self.shared_expert_gate is not None:
                rows = torch.cat([rows, self.shared_expert_gate.weight], dim=0)
            self._router_rows = rows.contiguous()
        return self._router_rows

    def _shared_mlp(self) -> GatedMLP | None:
        """The shared experts' MLP, DeepSeek's or Qwen2-MoE's gated one (None: none, or stacked)."""
        return self.shared_experts if self.shared_experts is not None else self.shared_expert

    def can_fuse_shared_experts(self) -> bool:
        """One rank, bias-free shared experts whose intermediate size is a whole number of routed experts'."""
        mlp = self._shared_mlp()
        if mlp is None or self.sharded or self.num_fused_shared:
            return False
        shared_inter, inter = mlp.down_proj.weight.shape[1], self.experts.inter
        return mlp.gate_up_proj.bias is None and mlp.down_proj.bias is None and shared_inter % inter == 0

    @torch.no_grad()
    def fuse_shared_experts(self) -> int:
        """Stack the shared experts after the routed ones as S = shared intermediate / expert intermediate
        experts (ids E..E+S-1; piece s holds gate, up rows and down columns s*I..(s+1)*I, so the sum over the
        pieces is the shared MLP), and drop the separate MLP: every token then takes its top-k plus those S,
        weighted 1 (DeepSeek) or by the sigmoid gate (Qwen2-MoE). Returns S (0: not fusable, unchanged).
        Run after the weights are loaded; the routed experts' loaders keep addressing ids below E."""
        if not self.can_fuse_shared_experts():
            return 0
        mlp = self._shared_mlp()
        experts, inter = self.experts, self.experts.inter
        num_shared = mlp.down_proj.weight.shape[1] // inter
        gate, up = mlp.gate_up_proj.weight.chunk(2, dim=0)                     # [S*I, H] each
        shared_w13 = torch.cat([gate.view(num_shared, inter, -1), up.view(num_shared, inter, -1)], dim=1)  # [S, 2I, H]
        down = mlp.down_proj.weight                                            # [H, S*I]
        shared_w2 = down.view(down.shape[0], num_shared, inter).permute(1, 0, 2)                           # [S, H, I]
        experts.w13 = nn.Parameter(torch.cat([experts.w13.data, shared_w13]), requires_grad=False)
        experts.w2 = nn.Parameter(torch.cat([experts.w2.data, shared_w2]), requires_grad=False)
        self.shared_experts = self.shared_expert = None
        self.num_fused_shared = num_shared
        return num_shared

    def post_load(self) -> None:
        self._fused_router_weight = None
        self._router_rows = None


def set_experts_fn(model: nn.Module, experts_fn: MoEFn) -> int:
    """Route every MoE layer of `model` through `experts_fn` (e.g. the Triton fused MoE); returns
    how many layers were switched."""
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    for layer in layers:
        layer.experts_fn = experts_fn
    return len(layers)
