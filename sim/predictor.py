"""The simulator's prediction of one step, for real runs to record next to the measured duration
(every real run is also a fidelity test). Torch-free."""
from __future__ import annotations

import functools
from typing import Callable

from hydra.utils import instantiate
from omegaconf import DictConfig

from runtime.build import decode_graph_batch_sizes, piecewise_graph_tokens
from runtime.core.batch import StepPlan
from sim.costmodel.base import CostModel, StepShape
from sim.step_shapes import shape_row


def runtime_graph_limits(cfg: DictConfig) -> dict:
    """The runtime's CUDA-graph limits for a cost model that leaves them open (null): the largest
    decode graph (`real.cuda_graph_max_bs`) and the largest piecewise-graph step (0: none), as the
    runtime decides them (runtime.build)."""
    limits = {}
    if "cuda_graph_max_bs" in cfg.costmodel and cfg.costmodel.cuda_graph_max_bs is None:
        limits["cuda_graph_max_bs"] = cfg.real.get("cuda_graph_max_bs")
    if "piecewise_max_tokens" in cfg.costmodel and cfg.costmodel.piecewise_max_tokens is None:
        limits["piecewise_max_tokens"] = piecewise_graph_tokens(cfg)
    return limits


def build_cost_model(cfg: DictConfig, core) -> CostModel:
    return instantiate(cfg.costmodel)(model=core.model, hardware=core.hardware, layout=core.layout,
                                      **runtime_graph_limits(cfg))


AUTO_TARGET = "sim.costmodel.auto.auto_cost_model"


def dp_attention_cost_model(cfg: DictConfig, core):
    """The step cost of a DP-attention layout (sim.costmodel.dp_attention), for mode=sim and for the
    predictions mode=real records. Its parts (attention on attention_tp GPUs, the MLP on all of them)
    need per-op costs, which a profile of whole one-GPU steps does not split: `costmodel=auto` prices
    them with its roofline, `costmodel=profiled` is refused. Decode steps are priced as replays of the
    graph size the runtime's ranks agree on (runtime.dp_attention_graphs) over the sizes it captures
    (runtime.build.decode_graph_batch_sizes), unless the cost model sets its own graph limit."""
    from sim.costmodel.dp_attention import DPAttentionCostModel

    node = cfg.costmodel
    if node.get("_target_") == AUTO_TARGET:
        node = node.roofline
    elif "profiled" in str(node.get("_target_", "")):
        raise ValueError("costmodel=profiled prices whole one-GPU steps; dp_attention needs per-op costs: "
                         "use costmodel=auto, roofline or roofline_fitted")
    make_cost_model = functools.partial(instantiate(node), **runtime_graph_limits(cfg))
    follows_runtime = "cuda_graph_max_bs" in node and node.cuda_graph_max_bs is None
    sizes = decode_graph_batch_sizes(cfg) if follows_runtime else None
    return DPAttentionCostModel(make_cost_model, core.model, core.hardware, core.layout, graph_batch_sizes=sizes)


def step_predictor(cost_model: CostModel, overlap: bool,
                   shapes: list[dict] | None = None) -> Callable[[StepPlan], float]:
    """Predicted duration of a step as the simulator would time it: the whole step, or under
    overlap scheduling its device part (the host part runs while the previous step executes).
    `shapes`: each predicted step's shape row (sim.step_shapes) is appended to it."""
    def predict(plan: StepPlan) -> float:
        shape = StepShape.from_plan(plan)
        if shapes is not None:
            shapes.append(shape_row(plan.step_id, shape))
        total = cost_model.step_time_s(shape)
        return total - cost_model.host_time_s(shape) if overlap else total
    return predict
