"""`costmodel=auto` (the default): the profiled cost model where sim/profiles/<hardware>/<model>/ holds a
profile of the run's replica layout (its own directory for one GPU, tp<N>[ep<M>]/ under it for N
tensor-parallel GPUs: sim.costmodel.profile_layouts), else the roofline (pp > 1, DP attention, or a layout
not profiled). Torch-free."""
from __future__ import annotations

from typing import Callable

from runtime.core.hardware import HardwareSpec
from runtime.core.layout import ParallelLayout
from runtime.core.model_spec import ModelSpec
from sim.costmodel.base import CostModel
from sim.costmodel.profile_layouts import layout_profile_dir
from sim.costmodel.profile_tables import has_profile


def profile_applies(model: ModelSpec, hardware: HardwareSpec, layout: ParallelLayout) -> bool:
    directory = layout_profile_dir(hardware.name, model.name, layout)
    return directory is not None and has_profile(directory)


def auto_cost_model(model: ModelSpec, hardware: HardwareSpec, layout: ParallelLayout,
                    profiled: Callable[..., CostModel], roofline: Callable[..., CostModel],
                    cuda_graph_max_bs: int | None = None, piecewise_max_tokens: int | None = None) -> CostModel:
    """profiled(...) when a profile applies to this model, hardware and layout, else roofline(...)."""
    make = profiled if profile_applies(model, hardware, layout) else roofline
    return make(model=model, hardware=hardware, layout=layout, cuda_graph_max_bs=cuda_graph_max_bs,
                piecewise_max_tokens=piecewise_max_tokens)
