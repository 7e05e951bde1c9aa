"""Cost of one lockstep step under DP attention (SGLang --enable-dp-attention): each of the dp
attention ranks runs attention on its own batch, then the MLP/MoE layers run over all tp GPUs
on every rank's tokens, with the gather and scatter between the two.

numpy-free, torch-free, no clock. Legend: D = dp attention ranks, T_r = tokens of rank r this
step, T_max = max_r T_r, H = hidden size, L = layers, k = experts per token.
"""
from __future__ import annotations

from typing import Callable, Sequence

from runtime.core.graph_grids import capture_batch_sizes
from runtime.core.hardware import HardwareSpec
from runtime.core.layout import ParallelLayout
from runtime.core.model_spec import ModelSpec
from runtime.dp_attention_graphs import dp_attention_graph_bs
from sim.costmodel.base import StepShape
from sim.costmodel.collectives import CollectiveCost

ATTENTION_OPS = ("attn_proj", "attn_prefill", "attn_decode")
REPRICED_OPS = ("tp_allreduce", "launch", "cpu_overhead")
COMM_OPS = ("attn_tp_allreduce", "dp_gather", "mlp_reduce_scatter")


def padded_decode_shape(shape: StepShape, bs: int) -> StepShape:
    """A rank's decode step (or idle step) padded to bs rows as a graph replays it: each padding row
    one decode token reading one KV token (the dummy slot)."""
    pad = bs - shape.num_decode_reqs
    return StepShape(num_decode_reqs=bs, decode_context_tokens=shape.decode_context_tokens + pad,
                     decode_shared_tokens=shape.decode_shared_tokens)


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
    Graphs as the runtime runs them (runtime.dp_attention_graphs, the rule both modes share): when no
    rank extends and the largest decode batch fits a captured size P, every rank is priced as a replay
    of P rows (fewer requests padded to P, an idle rank P padding rows; the MLP over D x P rows; graph
    launch and collectives); any other step is priced eagerly on every rank, decode-only ranks included.
    `make_cost_model(model=, hardware=, layout=, **overrides)` is the configured cost model (a roofline
    partial); its `cuda_graph` and `cuda_graph_max_bs` say whether and up to which batch graphs replay.
    `graph_batch_sizes`: the sizes the runtime captures (runtime.build.decode_graph_batch_sizes); None:
    SGLang's grid up to the cost model's limit, or (no limit) any batch at its own size. `collectives`
    default to the cost model's own.
    """

    def __init__(self, make_cost_model: Callable[..., object], model: ModelSpec,
                 hardware: HardwareSpec, layout: ParallelLayout,
                 collectives: CollectiveCost | None = None, act_dtype_bytes: int = 2,
                 graph_batch_sizes: Sequence[int] | None = None) -> None:
        if not layout.dp_attention:
            raise ValueError("DPAttentionCostModel needs a layout with dp_attention=True")
        layout.validate(model)
        self.layout, self.model = layout, model

        def make(tp: int, ep: int = 1, **overrides):
            return make_cost_model(model=model, hardware=hardware,
                                   layout=ParallelLayout(tp=tp, ep=ep, pp=layout.pp), **overrides)

        configured = make(layout.attention_tp)
        self.cuda_graph = getattr(configured, "cuda_graph", False)
        self.cuda_graph_max_bs = getattr(configured, "cuda_graph_max_bs", None)
        if not self.cuda_graph or self.cuda_graph_max_bs == 0:
            self.graph_batch_sizes: list[int] | None = []
        elif graph_batch_sizes is not None:
            self.graph_batch_sizes = sorted(graph_batch_sizes)
        elif self.cuda_graph_max_bs is not None:
            self.graph_batch_sizes = capture_batch_sizes(self.cuda_graph_max_bs)
        else:
            self.graph_batch_sizes = None
        # eager steps: every kernel launched (decode-only ranks too, when another rank extends)
        self.attention = make(layout.attention_tp, cuda_graph=False)
        self.mlp = make(layout.tp, layout.ep, cuda_graph=False)
        # replayed steps: the padded batches, whatever their size (the rule above decided)
        self.attention_graph = make(layout.attention_tp, cuda_graph=True, cuda_graph_max_bs=None)
        self.mlp_graph = make(layout.tp, layout.ep, cuda_graph=True, cuda_graph_max_bs=None)
        self.collectives = collectives if collectives is not None else self.mlp.collectives
        self.act_dtype_bytes = act_dtype_bytes
        moe = set(model.moe_layer_ids)
        self.num_moe_layers = len(moe)
        self.num_dense_layers = model.num_layers - len(moe)

    def graph_bs(self, shapes: Sequence[StepShape]) -> int | None:
        """The decode graph size every rank replays this step (None: eager), as the runtime picks it."""
        return dp_attention_graph_bs(shapes, self.graph_batch_sizes)

    def uses_graph(self, shapes: Sequence[StepShape]) -> bool:
        return self.graph_bs(shapes) is not None

    def step_time_s(self, shapes: Sequence[StepShape]) -> float:
        return sum(self.breakdown_s(shapes).values())

    def breakdown_s(self, shapes: Sequence[StepShape]) -> dict[str, float]:
        if len(shapes) != self.layout.dp:
            raise ValueError(f"expected {self.layout.dp} shapes (one per attention rank), got {len(shapes)}")
        if all(s.num_tokens == 0 for s in shapes):
            return {}
        bs = self.graph_bs(shapes)
        attention, mlp = (self.attention, self.mlp) if bs is None else (self.attention_graph, self.mlp_graph)
        if bs is not None:
            shapes = [padded_decode_shape(s, bs) for s in shapes]
        per_rank = [attention.breakdown_s(s) for s in shapes]
        slowest = max(per_rank, key=lambda b: sum(b[op] for op in ATTENTION_OPS))
        out = {op: slowest[op] for op in ATTENTION_OPS}
        for op, value in mlp.breakdown_s(merge_shapes(shapes)).items():
            if op not in ATTENTION_OPS and op not in REPRICED_OPS:
                out[op] = value
        out.update(self._communication_s(shapes, graph=bs is not None))
        out["launch_and_cpu"] = max(b["launch"] + b["cpu_overhead"] for b in per_rank)
        return out

    def communication_s(self, shapes: Sequence[StepShape]) -> dict[str, float]:
        """Per-op communication of one step over all layers (keys: COMM_OPS), at the padded rows of a
        graph replay when the step replays one."""
        bs = self.graph_bs(shapes)
        if bs is not None:
            shapes = [padded_decode_shape(s, bs) for s in shapes]
        return self._communication_s(shapes, graph=bs is not None)

    def _communication_s(self, shapes: Sequence[StepShape], graph: bool) -> dict[str, float]:
        layout = self.layout
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

