"""report.md of one run: what ran (from Hydra's .hydra/ files when present), the summary numbers,
and links to the run's PNGs. Must not import torch, simpy or matplotlib.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

REPORT_MD = "report.md"
FIGURE_TITLES = {
    "latency_cdf.png": "Latency (TTFT and TPOT CDFs)",
    "timeline.png": "Throughput, KV usage and queues over time",
    "step_durations.png": "Step durations by step kind",
}


def run_description(run_dir: Path) -> list[str]:
    """Lines naming model, hardware, layout and components, read from .hydra/config.yaml, plus
    the command-line overrides; empty when the run was not started through Hydra."""
    config_yaml, overrides_yaml = run_dir / ".hydra" / "config.yaml", run_dir / ".hydra" / "overrides.yaml"
    lines = []
    if config_yaml.exists():
        cfg = OmegaConf.load(config_yaml)
        short = lambda node: str(OmegaConf.select(cfg, f"{node}._target_", default="?")).rsplit(".", 1)[-1]   # noqa: E731
        lines.append(f"- model `{OmegaConf.select(cfg, 'model.name', default='?')}` on "
                     f"`{OmegaConf.select(cfg, 'hardware.name', default='?')}`, layout "
                     + " ".join(f"{k}={cfg.get(k, '?')}" for k in ("tp", "ep", "dp", "pp")))
        lines.append(f"- policy `{short('policy')}`, eviction `{short('eviction')}`, "
                     f"workload `{short('workload')}`, cost model `{short('costmodel')}`")
    if overrides_yaml.exists():
        overrides = OmegaConf.load(overrides_yaml)
        lines.append("- overrides: " + (" ".join(f"`{o}`" for o in overrides) if len(overrides) else "none"))
    return lines


def fmt_ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1e3:.2f}"


def summary_table(summary: dict) -> list[str]:
    tput = summary.get("throughput", {})
    rows = [
        ("requests (finished / aborted)",
         f"{summary.get('num_requests', 0)} ({summary.get('num_finished', 0)} / {summary.get('num_aborted', 0)})"),
        ("duration (s)", f"{summary.get('duration_s', 0.0):.3f}"),
        ("throughput (req/s)", f"{tput.get('requests_per_s', 0.0):.3f}"),
        ("throughput (output tokens/s)", f"{tput.get('output_tokens_per_s', 0.0):.1f}"),
        ("cache hit rate", f"{summary.get('cache_hit_rate', 0.0):.3f}"),
        ("KV capacity (tokens)", str(summary.get("kv_capacity_tokens", "–"))),
        ("steps (retractions)", f"{summary.get('num_steps', 0)} ({summary.get('num_retractions', 0)})"),
    ]
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        dist = summary.get(key) or {}
        rows.append((f"{key[:-2].upper()} p50 / p99 (ms)", f"{fmt_ms(dist.get('p50'))} / {fmt_ms(dist.get('p99'))}"))
    return ["| metric | value |", "|---|---|"] + [f"| {name} | {value} |" for name, value in rows]


def write_report(run_dir: str | Path, summary: dict, png_names: list[str]) -> Path:
    """Write report.md into `run_dir`, linking `png_names` (relative paths); returns its path."""
    out = Path(run_dir)
    lines = [f"# Run report ({summary.get('mode', '?')} mode)", ""]
    lines += run_description(out) + [""] + summary_table(summary) + [""]
    for name in png_names:
        lines += [f"## {FIGURE_TITLES.get(name, name)}", "", f"![{name}]({name})", ""]
    path = out / REPORT_MD
    path.write_text("\n".join(lines))
    return path
