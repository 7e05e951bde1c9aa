"""Which profile directory prices which parallel layout: sim/profiles/<hardware>/<model>/ for one GPU per
replica, its tp<N>[ep<M>]/ subdirectory for a replica of N tensor-parallel GPUs (M of them sharing the
experts), as `python run.py mode=profile tp=N ep=M` writes them. dp > 1 replicates a replica, so its
replicas' profile applies; pp and DP attention have none (a whole-step profile cannot split them).
Torch-free.
"""
from __future__ import annotations

import json
from pathlib import Path

from runtime.core.layout import ParallelLayout
from sim.costmodel.profile_tables import has_profile, profile_dir


def layout_name(tp: int, ep: int = 1) -> str:
    """"tp1", "tp2", "tp4ep4": how profiles and messages name a replica's layout."""
    return f"tp{tp}" + (f"ep{ep}" if ep > 1 else "")


def layout_subdir(tp: int, ep: int = 1) -> str:
    """The directory under sim/profiles/<hardware>/<model>/ ("" for one GPU: the profile itself)."""
    return "" if tp == ep == 1 else layout_name(tp, ep)


def layout_profile_dir(hardware_name: str, model_name: str, layout: ParallelLayout) -> Path | None:
    """Where the profile of `layout`'s replicas lives (it may not exist); None for layouts no profile
    prices (pp > 1, DP attention)."""
    if layout.pp > 1 or layout.dp_attention:
        return None
    return profile_dir(hardware_name, model_name) / layout_subdir(layout.tp, layout.ep)


def profiled_layouts(hardware_name: str, model_name: str) -> list[str]:
    """The layouts ("tp1", "tp2", ...) that have a profile of this model on this hardware."""
    base = profile_dir(hardware_name, model_name)
    names = ["tp1"] if has_profile(base) else []
    if base.is_dir():
        names += sorted(d.name for d in base.iterdir() if d.is_dir() and d.name.startswith("tp") and has_profile(d))
    return names


def measured_layout(directory: Path) -> tuple[int, int]:
    """(tp, ep) that the profile in `directory` measured, from its meta.json (without one: (1, 1), the
    one-GPU profiles written before layouts were recorded)."""
    meta = Path(directory) / "meta.json"
    if not meta.exists():
        return 1, 1
    layout = json.loads(meta.read_text()).get("layout") or {}
    return int(layout.get("tp", 1)), int(layout.get("ep", 1))


def profile_for_layout(hardware_name: str, model_name: str, layout: ParallelLayout, profile: str = "auto") -> Path:
    """The profile directory that prices `layout` (profile="auto": the layout's own under sim/profiles, else
    the directory given). Raises ValueError for a layout no profile prices or a profile of another layout,
    FileNotFoundError (naming the layouts that have one) where the layout has none."""
    if layout.pp > 1 or layout.dp_attention:
        raise ValueError("profiled cost model: a profile prices whole steps of one replica's tp/ep GPUs, not "
                         "pp > 1 or DP attention; use costmodel=roofline for this layout")
    wanted = layout_name(layout.tp, layout.ep)
    directory = layout_profile_dir(hardware_name, model_name, layout) if profile == "auto" else Path(profile)
    if not has_profile(directory):
        have = profiled_layouts(hardware_name, model_name)
        raise FileNotFoundError(
            f"no {wanted} profile for {model_name} on {hardware_name} in {directory} (profiled layouts: "
            f"{', '.join(have) or 'none'}): run `python run.py mode=profile tp={layout.tp} ep={layout.ep}` on "
            "that hardware, or use costmodel=roofline")
    measured = layout_name(*measured_layout(directory))
    if measured != wanted:
        raise ValueError(f"profiled cost model: {directory} is a {measured} profile; this run is {wanted} "
                         f"(its profile: sim/profiles/{hardware_name}/{model_name}/{layout_subdir(layout.tp, layout.ep)})")
    return directory
