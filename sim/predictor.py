"""The simulator's prediction of one step, for real runs to record next to the measured duration
(every real run is also a fidelity test). Torch-free."""
from __future__ import annotations

from typing import Callable

from hydra.utils import instantiate
from omegaconf import DictConfig

from runtime.build import piecewise_graph_tokens
from runtime.core.batch import StepPlan
from sim.costmodel.base import CostModel, StepShape


def runtime_graph_limits(cfg: DictConfig) -> dict:
    """The runtime's CUDA-graph limits for a cost model that leaves them open (null): the largest
    decode graph (`real.cuda_graph_max_bs`) and the largest piecewise-graph step (0: none), as the
    runtime decides them (runtime.build.piecewise_graph_tokens)."""
    limits = {}
    if "cuda_graph_max_bs" in cfg.costmodel and cfg.costmodel.cuda_graph_max_bs is None:
        limits["cuda_graph_max_bs"] = cfg.real.get("cuda_graph_max_bs")
    if "piecewise_max_tokens" in cfg.costmodel and cfg.costmodel.piecewise_max_tokens is None:
        limits["piecewise_max_tokens"] = piecewise_graph_tokens(cfg)
    return limits


def build_cost_model(cfg: DictConfig, core) -> CostModel:
    return instantiate(cfg.costmodel)(model=core.model, hardware=core.hardware, layout=core.layout,
                                      **runtime_graph_limits(cfg))


def step_predictor(cost_model: CostModel, overlap: bool) -> Callable[[StepPlan], float]:
    """Predicted duration of a step as the simulator would time it: the whole step, or under
    overlap scheduling its device part (the host part runs while the previous step executes)."""
    def predict(plan: StepPlan) -> float:
        shape = StepShape.from_plan(plan)
        total = cost_model.step_time_s(shape)
        return total - cost_model.host_time_s(shape) if overlap else total
    return predict
