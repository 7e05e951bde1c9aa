"""Fits the roofline's free constants to a committed profile (sim/profiles/<hardware>/<model>/, written by
`python run.py mode=profile`) by least squares on log(predicted / measured), and writes them with each
constant's source tables and residuals to sim/profiles/<hardware>/roofline_fit.yaml, which
`costmodel=roofline_fitted` reads. Fitted on the profile only, never on serving runs. Torch-free.

  python -m experiments.fit_roofline [--profile sim/profiles/h200/deepseek_v2_lite] [--out PATH]

Device constants come from the step tables (decode graph/eager, prefill, mixed: a step's device time is
RooflineCostModel.step_time_s - host_time_s) and the operator table (fused MoE, MoE layer, LM head +
sampler, each timed alone and eagerly); the CPU constants from the host table (schedule + commit).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from hydra.utils import instantiate
from omegaconf import OmegaConf
from scipy.optimize import least_squares

from runtime.core.fusion_limits import STACKED_SHARED_MAX_TOKENS
from runtime.core.hardware import HardwareSpec
from runtime.core.layout import ParallelLayout
from runtime.core.model_spec import ModelSpec
from sim.costmodel.base import StepShape
from sim.costmodel.roofline import FIT_FILE, MAX_MBU, RooflineCostModel

ROOT = Path(__file__).resolve().parents[1]
ROOFLINE_YAML = ROOT / "conf" / "costmodel" / "roofline.yaml"
# Kernels of each operator timed alone in ops.csv, counted as roofline_ops._count_kernels counts them.
OP_KERNELS = {"moe_experts_routed": 5,    # align, two grouped GEMMs, activation, weighted sum
              "moe_layer": 7,             # + router GEMM, top-k (shared experts stacked into the grouped GEMMs)
              "lm_head_sampler": 4}       # LM head, fp32 cast, two sampler kernels
OP_PARTS = {"moe_experts_routed": ("moe_experts",), "moe_layer": ("moe_gate", "moe_experts", "shared_experts"),
            "lm_head_sampler": ("lm_head", "sampler")}


def op_kernels(op: str, model: ModelSpec, num_tokens: int) -> int:
    """OP_KERNELS, plus, for a MoE layer past STACKED_SHARED_MAX_TOKENS on one rank, the dense shared MLP over
    the stacked rows: one gate_up GEMM, one activation, one down GEMM per stacked piece."""
    if op != "moe_layer" or num_tokens <= STACKED_SHARED_MAX_TOKENS or not model.shared_expert_intermediate_size:
        return OP_KERNELS[op]
    pieces = max(1, model.shared_expert_intermediate_size // model.moe_intermediate_size)
    return OP_KERNELS[op] + 2 + pieces


@dataclass(frozen=True)
class Param:
    name: str
    lower: float
    upper: float
    scale: float          # typical magnitude (the optimiser's step scale)
    family: str           # what it prices, for the YAML comment


# The device constants the profile determines, with bounds. Not fitted: cuda_graph_launch_s (one per
# step: not separable from kernel_floor_s), eager_kernel_gap_s (N x 1 us against 25+ ms eager steps),
# elementwise passes (collinear with mbu), collectives (tp = 1 profile; sim/profiles/<hw>/collectives.csv).
DEVICE_PARAMS = (
    Param("mfu", 0.05, 1.0, 0.5, "dense bf16 GEMMs (projections, dense MLP, shared experts, LM head): compute"),
    Param("mbu", 0.05, MAX_MBU, 0.8, "dense bf16 GEMMs: weight streaming, vs the copy rate"),
    Param("moe_mfu", 0.05, 1.0, 0.5, "fused-MoE grouped GEMMs: compute"),
    Param("moe_mbu", 0.05, MAX_MBU, 0.8, "fused-MoE grouped GEMMs: expert weight streaming"),
    Param("attention_mfu", 0.05, 1.0, 0.5, "prefill / extend attention (MLA here; GQA shares it)"),
    Param("attention_mbu", 0.05, MAX_MBU, 0.8, "decode attention over the KV cache (MLA here; GQA shares it)"),
    Param("kernel_floor_s", 0.0, 50e-6, 2e-6, "GPU time every kernel costs however small (graph replay)"),
    Param("kernel_launch_s", 1e-6, 200e-6, 10e-6, "eager steps: host launch time per kernel"),
    Param("eager_launch_per_seq_s", 0.0, 100e-6, 2e-6, "eager steps: host launch time per sequence"),
    Param("sampler_per_seq_s", 0.0, 50e-6, 1e-6, "sampler GPU time per sequence"),
)
HOST_PARAMS = (
    Param("cpu_overhead_s", 0.0, 5e-3, 1e-4, "scheduler host time per step"),
    Param("cpu_overhead_per_seq_s", 0.0, 1e-3, 1e-6, "per sequence of the step"),
    Param("cpu_overhead_per_extend_s", 0.0, 1e-3, 1e-5, "per prefill item, beyond the per-sequence cost"),
    Param("cpu_overhead_per_token_s", 0.0, 1e-4, 1e-8, "per prefill token"),
)
FP8_ASSUMPTION = (0.7, "ASSUMED, not fitted: no fp8 profile exists on this hardware. fp8 GEMMs keep 0.7 of "
                  "their bf16 compute efficiency against the 2x fp8 peak (1.4x the bf16 rate): block-scaled "
                  "fp8 GEMMs reach about twice the bf16 rate only at their best shapes (DeepGEMM's README: up "
                  "to 1550 TFLOPS on H800), far less at serving shapes. fp8 weight streaming keeps mbu (the "
                  "bytes halve with the weight dtype).")


@dataclass
class Points:
    """Measured points: `table` names the profile table of each, `kind` how it is priced."""

    table: list[str] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)       # runtime | eager | op:<name> | host
    shape: list[StepShape] = field(default_factory=list)
    measured_s: list[float] = field(default_factory=list)

    def add(self, table: str, kind: str, shape: StepShape, seconds: float) -> None:
        self.table.append(table)
        self.kind.append(kind)
        self.shape.append(shape)
        self.measured_s.append(float(seconds))

    def __len__(self) -> int:
        return len(self.measured_s)


def device_points(directory: Path) -> Points:
    """Every device-time point of the profile's decode, prefill, mixed and ops tables."""
    pts = Points()
    for r in pd.read_csv(directory / "decode.csv").itertuples(index=False):
        kind = "runtime" if r.path == "graph" else "eager"         # eager: graphs off
        pts.add(f"decode.csv {r.path}", kind, StepShape((), (), int(r.batch_size), int(r.total_context_tokens)),
                r.device_s)
    for r in pd.read_csv(directory / "prefill.csv").itertuples(index=False):
        n, each = int(r.num_seqs), int(r.new_tokens) // int(r.num_seqs)
        table = "prefill.csv one sequence" if n == 1 else "prefill.csv several sequences"
        pts.add(table, "runtime", StepShape((each,) * n, (int(r.prefix_tokens),) * n), r.device_s)
    if (directory / "mixed.csv").exists():
        for r in pd.read_csv(directory / "mixed.csv").itertuples(index=False):
            shape = StepShape((int(r.new_tokens),), (0,), int(r.num_decode), int(r.num_decode * r.context_tokens))
            pts.add("mixed.csv", "runtime", shape, r.device_s)
    if (directory / "ops.csv").exists():
        for r in pd.read_csv(directory / "ops.csv").itertuples(index=False):
            if r.op in OP_KERNELS:
                tokens = int(r.num_tokens)
                pts.add(f"ops.csv {r.op}", f"op:{r.op}", StepShape((), (), tokens, tokens), r.device_s)
    return pts


def host_points(directory: Path) -> Points:
    """The host table's schedule + commit per step (what costmodel=profiled reads as host time)."""
    pts = Points()
    for r in pd.read_csv(directory / "host.csv").itertuples(index=False):
        n, tokens = int(r.num_reqs), int(r.new_tokens)
        shape = (StepShape((), (), n, 33 * n) if r.kind == "decode"
                 else StepShape((tokens // n,) * n, (0,) * n))
        pts.add(f"host.csv {r.kind}", "host", shape, r.schedule_s + r.commit_s)
    return pts


def base_constants(meta: dict | None = None) -> dict:
    """roofline.yaml's values (the unfitted defaults), without Hydra keys; collectives off (tp = 1); the
    graph limits the profiled runtime ran with (meta.json's last run: decode graphs up to cuda_graph_max_bs,
    piecewise graphs up to piecewise_max_tokens; absent = none, as before piecewise graphs existed)."""
    cfg = OmegaConf.to_container(OmegaConf.load(ROOFLINE_YAML))
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    run = (meta or {}).get("runs", [{}])[-1]
    cfg.update(collective_table=None, cuda_graph_max_bs=run.get("cuda_graph_max_bs"),
               piecewise_max_tokens=run.get("piecewise_max_tokens", 0), cache_size=256)
    return cfg


class Predictor:
    """Predicted seconds of every point for a set of constants (on top of `base`)."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, base: dict, points: Points) -> None:
        self.model, self.hardware, self.base, self.points = model, hardware, base, points

    def build(self, constants: dict, graph: bool) -> RooflineCostModel:
        kwargs = {**self.base, **constants, "cuda_graph": graph}
        return RooflineCostModel(self.model, self.hardware, ParallelLayout(), **kwargs)

    def __call__(self, constants: dict) -> np.ndarray:
        graph, eager = self.build(constants, True), self.build(constants, False)
        out = np.empty(len(self.points))
        for i, (kind, shape) in enumerate(zip(self.points.kind, self.points.shape)):
            if kind == "host":
                out[i] = graph.host_time_s(shape)
            elif kind.startswith("op:"):
                out[i] = eager_op_s(eager, kind[3:], shape)
            else:
                cm = graph if kind == "runtime" else eager
                out[i] = cm.step_time_s(shape) - cm.host_time_s(shape)
        return out


def eager_op_s(cm: RooflineCostModel, op: str, shape: StepShape) -> float:
    """One operator timed alone, launched eagerly: its GPU time (from the roofline's breakdown of a
    step of that many tokens, per layer) and kernel floors, or its kernels' launches, the larger."""
    parts = cm.breakdown_s(shape)
    per_layer = cm.coef.num_moe_layers if op.startswith("moe") else 1
    kernels = op_kernels(op, cm.model, shape.num_tokens)
    gpu = sum(parts[p] for p in OP_PARTS[op]) / per_layer + kernels * (cm.coef.kernel_floor_s + cm.coef.eager_kernel_gap_s)
    return max(gpu + cm.kernel_launch_s, kernels * cm.kernel_launch_s)


@dataclass
class Fit:
    constants: dict
    residuals: np.ndarray          # log(predicted / measured) per point, after the fit
    start_residuals: np.ndarray    # the same with the starting constants
    sources: dict                  # constant -> [(table, share of the constant's sensitivity)]
    rel_std_error: dict            # constant -> standard error / value (from the Jacobian)


def fit_constants(predict: Predictor, params: tuple[Param, ...], start: dict) -> Fit:
    """Least squares on log(predicted / measured) over every point, within each constant's bounds."""
    names = [p.name for p in params]
    measured = np.log(np.asarray(predict.points.measured_s))
    scale = np.array([p.scale for p in params])

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(predict(dict(zip(names, x * scale)))) - measured

    x0 = np.array([min(max(start[n], p.lower), p.upper) for n, p in zip(names, params)]) / scale
    lower, upper = np.array([p.lower for p in params]) / scale, np.array([p.upper for p in params]) / scale
    result = least_squares(residuals, x0, bounds=(lower, upper), x_scale=1.0, diff_step=1e-4,
                           xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=400)
    values = result.x * scale
    constants = {n: float(v) for n, v in zip(names, values)}
    jac = result.jac                                        # d residual / d (value / scale)
    return Fit(constants, result.fun, residuals(x0), _sources(predict.points.table, names, jac),
               _std_errors(names, values / scale, jac, result.fun))


def _sources(tables: list[str], names: list[str], jac: np.ndarray) -> dict:
    """Per constant, the tables holding at least 10% of its summed squared sensitivity, largest first."""
    out, tables = {}, np.asarray(tables)
    for j, name in enumerate(names):
        weight = jac[:, j] ** 2
        total = weight.sum()
        shares = {t: float(weight[tables == t].sum() / total) if total else 0.0 for t in dict.fromkeys(tables)}
        out[name] = sorted(((t, s) for t, s in shares.items() if s >= 0.1), key=lambda ts: -ts[1])
    return out


def _std_errors(names: list[str], x: np.ndarray, jac: np.ndarray, res: np.ndarray) -> dict:
    dof = max(len(res) - len(names), 1)
    cov = np.linalg.pinv(jac.T @ jac) * float(res @ res) / dof
    return {n: float(np.sqrt(max(cov[j, j], 0.0)) / x[j]) if x[j] else float("inf") for j, n in enumerate(names)}


def table_residuals(tables: list[str], residuals: np.ndarray) -> pd.DataFrame:
    """Per table: points, median and RMS |predicted / measured - 1|, and the worst point's error."""
    frame = pd.DataFrame({"table": tables, "err": np.expm1(residuals)})
    agg = frame.groupby("table", sort=False)["err"].agg(
        points="size", median_abs=lambda e: float(np.median(np.abs(e))),
        rms=lambda e: float(np.sqrt(np.mean(e ** 2))), worst=lambda e: float(e.iloc[np.argmax(np.abs(e.to_numpy()))]))
    return agg.reset_index()


def load_profile(directory: Path) -> tuple[ModelSpec, HardwareSpec, dict]:
    meta = json.loads((directory / "meta.json").read_text())
    model = instantiate(OmegaConf.load(ROOT / "conf" / "model" / f"{meta['model']}.yaml"))
    hardware = instantiate(OmegaConf.load(ROOT / "conf" / "hardware" / f"{meta['hardware']}.yaml"))
    return model, hardware, meta


def run_fit(directory: Path) -> dict:
    """Both fits on one profile directory: {"device": Fit, "host": Fit, "points": ..., ...}."""
    model, hardware, meta = load_profile(directory)
    base = base_constants(meta)
    start = {**base, "moe_mfu": base["mfu"] * base["moe_efficiency"], "moe_mbu": base["mbu"] * base["moe_efficiency"],
             "kernel_launch_s": hardware.kernel_launch_s, "eager_launch_per_seq_s": 1e-6,
             "cpu_overhead_per_extend_s": 1e-5, "cpu_overhead_per_token_s": 1e-8}
    dev, host = device_points(directory), host_points(directory)
    device_fit = fit_constants(Predictor(model, hardware, base, dev), DEVICE_PARAMS, start)
    unfitted_dev = np.log(Predictor(model, hardware, base, dev)({})) - np.log(dev.measured_s)
    host_fit = fit_constants(Predictor(model, hardware, base, host), HOST_PARAMS, start)
    unfitted_host = np.log(Predictor(model, hardware, base, host)({})) - np.log(host.measured_s)
    return {"device": device_fit, "host": host_fit, "device_points": dev, "host_points": host, "meta": meta,
            "unfitted_device": unfitted_dev, "unfitted_host": unfitted_host, "hardware": hardware, "model": model}


def _fmt(value: float) -> str:
    text = f"{value:.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.4e}"
    return text if any(c in text for c in ".e") else text + ".0"


def render_yaml(result: dict, directory: Path) -> str:
    """The fit file: `constants` with, next to each, what it prices, its source tables (share of its
    sensitivity), its standard error and the RMS error of the fitted model on those tables."""
    meta = result["meta"]
    lines = [f"# Roofline constants fitted to the {meta['hardware']} profile {directory.relative_to(ROOT)} "
             f"({meta['model']}, {meta.get('device_name', '')}),",
             "# written by `python -m experiments.fit_roofline`: least squares on log(predicted / measured) over",
             "# every point of the profile (never on serving runs). Read by costmodel=roofline_fitted for any model",
             "# on this hardware; constants not named here keep conf/costmodel/roofline.yaml's values.",
             "# Per table, |predicted / measured - 1| of device (or host) time, unfitted -> fitted roofline:"]
    for kind in ("device", "host"):
        pts = result[f"{kind}_points"]
        before = table_residuals(pts.table, result[f"unfitted_{kind}"]).set_index("table")
        after = table_residuals(pts.table, result[kind].residuals).set_index("table")
        for table in after.index:
            b, a = before.loc[table], after.loc[table]
            lines.append(f"#   {table:<31} {int(a.points):3d} pts  median {b.median_abs:6.1%} -> {a.median_abs:5.1%}"
                         f"  rms {b.rms:6.1%} -> {a.rms:5.1%}  worst {a.worst:+6.1%}")
    lines += ["# Not fitted (roofline.yaml's or the hardware's values stay): cuda_graph_launch_s (once per step, not",
              "# separable from kernel_floor_s), eager_kernel_gap_s (~0.6 ms against 25+ ms eager steps), sampler_base_s,",
              "# elementwise passes (collinear with mbu), collectives (a tp=1 profile; sim/profiles/<hw>/collectives.csv).",
              f"hardware: {meta['hardware']}", f"profile: {directory.relative_to(ROOT)}", "constants:"]
    for kind, params in (("device", DEVICE_PARAMS), ("host", HOST_PARAMS)):
        fit, pts = result[kind], result[f"{kind}_points"]
        after = table_residuals(pts.table, fit.residuals).set_index("table")
        for p in params:
            value = fit.constants[p.name]
            sources = fit.sources[p.name]
            where = ", ".join(f"{t} {s:.0%}" for t, s in sources) or "no table moves it"
            rms = ", ".join(f"{after.loc[t].rms:.1%}" for t, _ in sources)
            bound = " (at its bound)" if np.isclose(value, p.lower) or np.isclose(value, p.upper) else ""
            lines.append(f"  {p.name}: {_fmt(value)}")
            lines.append(f"  # ^ {p.family}. Source: {where}; std error {fit.rel_std_error[p.name]:.1%}{bound};"
                         f" fitted rms error there {rms or '-'}")
    value, why = FP8_ASSUMPTION
    lines.append(f"  fp8_mfu_scale: {value}")
    lines.append(f"  # ^ {why}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=ROOT / "sim" / "profiles" / "h200" / "deepseek_v2_lite")
    parser.add_argument("--out", type=Path, default=None, help="default: sim/profiles/<hardware>/roofline_fit.yaml")
    args = parser.parse_args()
    directory = args.profile.resolve()
    result = run_fit(directory)
    out = args.out or directory.parent / FIT_FILE
    text = render_yaml(result, directory)
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
