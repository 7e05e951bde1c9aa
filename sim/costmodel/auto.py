"""`costmodel=auto` (the default): the profiled cost model where sim/profiles/<hardware>/<model>/ holds a
profile and the layout is the one it measured (one GPU per replica, no DP attention), else the roofline.
Torch-free."""
from __future__ import annotations

from typing import Callable

from runtime.core.hardware import HardwareSpec
from runtime.core.layout import ParallelLayout
from runtime.core.model_spec import ModelSpec
from sim.costmodel.base import CostModel
from sim.costmodel.profile_tables import has_profile, profile_dir


def profile_applies(model: ModelSpec, hardware: HardwareSpec, layout: ParallelLayout) -> bool:
    return (layout.tp == layout.ep == layout.pp == 1 and not layout.dp_attention
            and has_profile(profile_dir(hardware.name, model.name)))


def auto_cost_model(model: ModelSpec, hardware: HardwareSpec, layout: ParallelLayout,
                    profiled: Callable[..., CostModel], roofline: Callable[..., CostModel],
                    cuda_graph_max_bs: int | None = None, piecewise_max_tokens: int | None = None) -> CostModel:
    """profiled(...) when a profile applies to this model, hardware and layout, else roofline(...)."""
    make = profiled if profile_applies(model, hardware, layout) else roofline
    return make(model=model, hardware=hardware, layout=layout, cuda_graph_max_bs=cuda_graph_max_bs,
                piecewise_max_tokens=piecewise_max_tokens)
