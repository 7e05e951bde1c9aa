"""Cost of one lockstep step under DP attention (SGLang --enable-dp-attention): each of the dp
attention ranks runs attention on its own batch, then the MLP/MoE layers run over all tp GPUs
on every rank's tokens, with the gather and scatter between the two.

numpy-free, torch-free, no clock. Legend: D = dp attention ranks, T_r = tokens of rank r this
step, T_max = max_r T_r, H = hidden size, L = layers, k = experts per token.
"""
from __future__ import annotations

from typing import Callable, Sequence

from runtime.core.hardware import HardwareSpec
from runtime.core.layout import ParallelLayout
from runtime.core.model_spec import ModelSpec
from sim.costmodel.base import StepShape
from sim.costmodel.collectives import CollectiveCost

ATTENTION_OPS = ("attn_proj", "attn_prefill", "attn_decode")
REPRICED_OPS = ("tp_allreduce", "launch", "cpu_overhead")
COMM_OPS = ("attn_tp_allreduce", "dp_gather", "mlp_reduce_scatter")


def merge_shapes(shapes: Sequence[StepShape]) -> StepShape:
    """Every rank's sequences as one batch (what the MLP layers see after the gather)."""
    return StepShape(
        extend_new_tokens=tuple(n for s in shapes for n in s.extend_new_tokens),
        extend_prefix_tokens=tuple(p for s in shapes for p in s.extend_prefix_tokens),
        num_decode_reqs=sum(s.num_decode_reqs for s in shapes),
        decode_context_tokens=sum(s.decode_context_tokens for s in shapes),
        decode_shared_tokens=sum(s.decode_shared_tokens for s in shapes))   # no rank reads another's KV


class DPAttentionCostModel:
    """Prices a list of StepShapes, one per attention rank (an idle rank: StepShape()).

    step = max_r attention(T_r) on a layout of attention_tp GPUs  (heads split tp / dp ways)
         + MLP/MoE, lm_head, sampler, norms of the merged batch on the full tp (and ep) layout
         + communication, per layer:
             attention all-reduce over attention_tp GPUs of T_max x H (when attention_tp > 1);
             every MLP/MoE layer: all-gather over the D ranks of the padded D x T_max x H hidden
               states, then reduce-scatter over tp GPUs of the same buffer (each rank keeps its
               own tokens' MLP output). With ep > 1 the MoE runs expert-parallel on the gathered
               tokens as the runtime does: each GPU computes the pairs of its own experts (the
               MLP cost model's MoE pricing) and the reduce-scatter is the combine; no all-to-all;
         + the slowest rank's launch and scheduler time.
    Collectives are priced as replayed from a CUDA graph when every rank decodes (or idles) within
    the cost model's graph limit, else eagerly. `make_cost_model(model=, hardware=, layout=)` is
    the configured cost model (a roofline partial); `collectives` default to its own.
    """

    def __init__(self, make_cost_model: Callable[..., object], model: ModelSpec,
                 hardware: HardwareSpec, layout: ParallelLayout,
                 collectives: CollectiveCost | None = None, act_dtype_bytes: int = 2) -> None:
        if not layout.dp_attention:
            raise ValueError("DPAttentionCostModel needs a layout with dp_attention=True")
        layout.validate(model)
        self.layout, self.model = layout, model
        self.attention = make_cost_model(model=model, hardware=hardware,
                                         layout=ParallelLayout(tp=layout.attention_tp, pp=layout.pp))
        self.mlp = make_cost_model(model=model, hardware=hardware,
                                   layout=ParallelLayout(tp=layout.tp, ep=layout.ep, pp=layout.pp))
        self.collectives = collectives if collectives is not None else self.mlp.collectives
        self.cuda_graph = getattr(self.attention, "cuda_graph", False)
        self.cuda_graph_max_bs = getattr(self.attention, "cuda_graph_max_bs", None)
        self.act_dtype_bytes = act_dtype_bytes
        moe = set(model.moe_layer_ids)
        self.num_moe_layers = len(moe)
        self.num_dense_layers = model.num_layers - len(moe)

    def uses_graph(self, shapes: Sequence[StepShape]) -> bool:
        busiest = max(s.num_decode_reqs for s in shapes)
        return (self.cuda_graph and all(not s.extend_new_tokens for s in shapes) and busiest > 0
                and (self.cuda_graph_max_bs is None or busiest <= self.cuda_graph_max_bs))

    def step_time_s(self, shapes: Sequence[StepShape]) -> float:
        return sum(self.breakdown_s(shapes).values())

    def breakdown_s(self, shapes: Sequence[StepShape]) -> dict[str, float]:
        if len(shapes) != self.layout.dp:
            raise ValueError(f"expected {self.layout.dp} shapes (one per attention rank), got {len(shapes)}")
        merged = merge_shapes(shapes)
        if merged.num_tokens == 0:
            return {}
        per_rank = [self.attention.breakdown_s(s) for s in shapes]
        slowest = max(per_rank, key=lambda b: sum(b[op] for op in ATTENTION_OPS))
        out = {op: slowest[op] for op in ATTENTION_OPS}
        for op, value in self.mlp.breakdown_s(merged).items():
            if op not in ATTENTION_OPS and op not in REPRICED_OPS:
                out[op] = value
        out.update(self.communication_s(shapes))
        out["launch_and_cpu"] = max(b["launch"] + b["cpu_overhead"] for b in per_rank)
        return out

    def communication_s(self, shapes: Sequence[StepShape]) -> dict[str, float]:
        """Per-op communication of one step over all layers (keys: COMM_OPS)."""
        layout, graph = self.layout, self.uses_graph(shapes)
        hidden_bytes = self.model.hidden_size * self.act_dtype_bytes
        t_max = max(s.num_tokens for s in shapes)
        padded_bytes = layout.dp * t_max * hidden_bytes
        cost = self.collectives.time_s
        out = dict.fromkeys(COMM_OPS, 0.0)
        out["attn_tp_allreduce"] = self.model.num_layers * cost(
            "all_reduce", t_max * hidden_bytes, layout.attention_tp, graph)
        mlp_layers = self.num_dense_layers + self.num_moe_layers
        out["dp_gather"] = mlp_layers * cost("all_gather", padded_bytes, layout.dp, graph)
        out["mlp_reduce_scatter"] = mlp_layers * cost("reduce_scatter", padded_bytes, layout.tp, graph)
        return out

