"""Pictures of one run, written into its run directory by both modes: latency CDFs, a timeline
(throughput, KV usage, queues) and step durations by step kind (PNG), plus a report.md linking
them. matplotlib (Figure objects rendered by Agg, no pyplot state), imported lazily; must not
import torch or simpy.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.report import write_report
from runtime.metrics import per_request_latencies

LATENCY_PNG, TIMELINE_PNG, STEPS_PNG = "latency_cdf.png", "timeline.png", "step_durations.png"
MAX_TIMELINE_POINTS = 4000    # steps drawn on the KV/queue panels (thinned beyond this)
DPI = 90


def new_figure(figsize: tuple[float, float]):
    """A matplotlib Figure outside pyplot: no global figure state, no backend switch; savefig
    renders it with Agg."""
    from matplotlib.figure import Figure
    return Figure(figsize=figsize)


def write_run_plots(run_dir: str | Path, requests: pd.DataFrame, steps: pd.DataFrame,
                    summary: dict) -> list[Path]:
    """Write the three PNGs and report.md into `run_dir`; returns the paths written. Empty
    frames give figures that say "no data" rather than errors."""
    out = Path(run_dir)
    requests, steps = numeric(requests), numeric(steps)
    finished = requests[requests["finish_reason"].isin(["length", "stop"])]
    pngs = []
    for name, draw in ((LATENCY_PNG, lambda: latency_figure(finished)),
                       (TIMELINE_PNG, lambda: timeline_figure(finished, steps, summary)),
                       (STEPS_PNG, lambda: step_duration_figure(steps))):
        draw().savefig(out / name, dpi=DPI)
        pngs.append(out / name)
    return pngs + [write_report(out, summary, [p.name for p in pngs])]


TEXT_COLUMNS = ("rid", "mode", "finish_reason", "token_times_s")


def numeric(frame: pd.DataFrame) -> pd.DataFrame:
    """Every column but the text/list ones as numbers (records concatenated from several replicas,
    some of them empty, can arrive with object columns)."""
    frame = frame.copy()
    for column in frame.columns:
        if column not in TEXT_COLUMNS:
            frame[column] = pd.to_numeric(frame[column], errors="coerce")
    return frame


def by_replica(steps: pd.DataFrame, limit: int = 8) -> list[tuple[str, pd.DataFrame]]:
    """(label, steps) per DP replica when the records have several (the first `limit`), else one."""
    if "replica" not in steps.columns or steps["replica"].nunique() <= 1:
        return [("", steps)]
    groups = list(steps.groupby("replica"))[:limit]
    return [(f"replica {int(r)} ", part) for r, part in groups]


def cdf(ax, values: np.ndarray, label: str) -> None:
    values = np.sort(np.asarray(values, dtype=np.float64))
    values = values[np.isfinite(values)]
    if values.size == 0:
        return
    fractions = np.arange(1, values.size + 1) / values.size
    keep = np.unique(np.linspace(0, values.size - 1, min(values.size, 2000)).astype(int))   # thin long runs
    ax.step(values[keep], fractions[keep], where="post", label=label)


def no_data(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes, color="gray")


def latency_figure(finished: pd.DataFrame):
    """CDFs of TTFT and TPOT over finished requests (ms; log x when they spread widely)."""
    fig = new_figure((9, 3.4))
    axes = fig.subplots(1, 2)
    lat = per_request_latencies(finished)
    for ax, key, title in ((axes[0], "ttft_s", "time to first token"), (axes[1], "tpot_s", "time per output token")):
        values_ms = lat[key].dropna().to_numpy() * 1e3
        values_ms = values_ms[values_ms > 0]
        if values_ms.size:
            cdf(ax, values_ms, key[:-2])
            scale_axis(ax, values_ms, "x")
            for p, style in ((50, ":"), (99, "--")):
                ax.axvline(np.percentile(values_ms, p), color="gray", ls=style, lw=0.8, label=f"p{p}")
            ax.legend(loc="lower right", fontsize=8)
        else:
            no_data(ax, "finished requests")
        ax.set_xlabel(f"{key[:-2].upper()} (ms)")
        ax.set_ylabel("fraction of finished requests")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.16, top=0.9, wspace=0.25)   # tight_layout costs ~0.15 s
    return fig


def time_bins_s(start_s: float, end_s: float, num_bins: int = 60) -> np.ndarray:
    span_s = max(end_s - start_s, 1e-9)
    return np.linspace(start_s, start_s + span_s, num_bins + 1)


def thinned(frame: pd.DataFrame, limit: int = MAX_TIMELINE_POINTS) -> pd.DataFrame:
    return frame if len(frame) <= limit else frame.iloc[:: int(np.ceil(len(frame) / limit))]


def timeline_figure(finished: pd.DataFrame, steps: pd.DataFrame, summary: dict):
    """Three panels over simulated/wall time: token throughput, KV pool usage, queue lengths."""
    fig = new_figure((9, 6.6))
    axes = fig.subplots(3, 1, sharex=True)
    if len(steps) == 0:
        for ax, what in zip(axes, ("steps", "KV records", "queue records")):
            no_data(ax, what)
    else:
        draw_throughput(axes[0], finished, steps)
        draw_kv_usage(axes[1], steps, summary.get("kv_capacity_tokens"))
        for label, part in by_replica(steps):
            view = thinned(part, MAX_TIMELINE_POINTS // 4 if label else MAX_TIMELINE_POINTS)
            axes[2].plot(view["end_s"], view["num_running"], lw=0.9, label=f"{label}running")
            axes[2].plot(view["end_s"], view["num_waiting"], lw=0.9, ls="--" if label else "-", label=f"{label}waiting")
        axes[2].legend(loc="upper right", fontsize=7, ncol=2)
    axes[0].set_ylabel("tokens/s")
    axes[0].set_title("throughput, KV usage and queues over time")
    axes[1].set_ylabel("KV pool used (%)")
    axes[2].set_ylabel("requests")
    axes[2].set_xlabel("time (s, run clock)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.08, top=0.95, hspace=0.12)
    return fig


def draw_throughput(ax, finished: pd.DataFrame, steps: pd.DataFrame) -> None:
    """Prefill tokens/s (from the steps) and output tokens/s (from the token times), binned."""
    bins_s = time_bins_s(float(steps["start_s"].min()), float(steps["end_s"].max()))
    width_s = bins_s[1] - bins_s[0]
    prefill, _ = np.histogram(steps["end_s"], bins=bins_s, weights=steps["num_prefill_tokens"])
    ax.plot(bins_s[:-1], prefill / width_s, drawstyle="steps-post", label="prefill (input) tokens/s")
    times = [np.asarray(t, dtype=np.float64) for t in finished["token_times_s"] if len(t)]
    if times:
        output, _ = np.histogram(np.concatenate(times), bins=bins_s)
        ax.plot(bins_s[:-1], output / width_s, drawstyle="steps-post", label="output tokens/s")
    ax.legend(loc="upper right", fontsize=8)


def draw_kv_usage(ax, steps: pd.DataFrame, capacity_tokens: int | None) -> None:
    """Share of the KV pool in use (each replica's own pool when there are several)."""
    for label, part in by_replica(steps):
        view = thinned(part, MAX_TIMELINE_POINTS // 4 if label else MAX_TIMELINE_POINTS)
        used = view["kv_tokens_used"]
        ax.plot(view["end_s"], 100.0 * used / capacity_tokens if capacity_tokens else used, lw=0.9,
                label=label.strip() or None)
    if capacity_tokens:
        ax.set_ylim(0, 105)
    else:
        ax.set_ylabel("KV tokens used")
    if len(by_replica(steps)) > 1:
        ax.legend(loc="upper right", fontsize=7, ncol=2)


def step_duration_figure(steps: pd.DataFrame):
    """Box plot of step durations (ms) per step kind, with counts and medians in the labels."""
    fig = new_figure((7, 3.4))
    ax = fig.subplots()
    durations_ms = (steps["end_s"] - steps["start_s"]).to_numpy(dtype=np.float64) * 1e3
    kinds = sorted(steps["mode"].unique()) if len(steps) else []
    groups = [durations_ms[(steps["mode"] == kind).to_numpy()] for kind in kinds]
    if not groups:
        no_data(ax, "steps")
    else:
        ax.boxplot(groups, whis=(1, 99), showfliers=False, **horizontal())
        ax.set_yticks(range(1, len(kinds) + 1),
                      [f"{k}\n{g.size} steps\nmedian {np.median(g):.2f} ms" for k, g in zip(kinds, groups)],
                      fontsize=8)
        scale_axis(ax, durations_ms, "x")
    ax.set_xlabel("step duration (ms; box = quartiles, whiskers = p1-p99)")
    ax.set_title("step duration by step kind")
    ax.grid(alpha=0.3)
    fig.subplots_adjust(left=0.2, right=0.97, bottom=0.16, top=0.9)
    return fig


def horizontal() -> dict:
    """boxplot's keyword for horizontal boxes (`vert` is deprecated from matplotlib 3.10)."""
    import matplotlib
    major, minor = (int(x) for x in matplotlib.__version__.split(".")[:2])
    return {"orientation": "horizontal"} if (major, minor) >= (3, 10) else {"vert": False}


def scale_axis(ax, values: np.ndarray, axis: str) -> None:
    """Log scale when the positive values span more than a factor of 20, else linear."""
    positive = values[np.isfinite(values) & (values > 0)]
    if positive.size and positive.max() > 20 * positive.min():
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")

def plot_run(run_dir: str | Path, requests: pd.DataFrame, steps: pd.DataFrame, summary: dict) -> list[Path]:
    """`write_run_plots` for the run drivers: a failure to draw prints one warning line and never
    fails the run (its records are already written)."""
    try:
        return write_run_plots(run_dir, requests, steps, summary)
    except Exception as err:   # noqa: BLE001 - pictures are optional; the records are the result
        print(f"warning: run plots not written ({type(err).__name__}: {err})", file=sys.stderr)
        return []
