"""Why `costmodel=profiled` misprices Mooncake's decode steps: price / measured of every decode-only step of the real runs
binned by padded batch, padding rows, context per request and spread; the profile's context linearity; the served-decode
probe's oracles; and candidate corrections (padding rows, the attention split) scored on every real run, against the
table's padded rows as measured (costmodel.padding_rows=as_real). Torch-free.

  python -m experiments.mooncake_decode_errors [--real experiments/results/h200/fidelity/real] [--out-csv steps.csv]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.compose import compose_config
from experiments.fidelity_runs import ALL_WORKLOADS
from runtime.build import build_core
from runtime.core.graph_grids import capture_batch_sizes, padded_size
from sim.costmodel.mla_kv_split import equal_split, makespan_tokens
from sim.predictor import build_cost_model
from sim.step_shapes import read_shapes

PROFILE = Path("sim/profiles/h200/deepseek_v2_lite")
PROBE = Path("experiments/results/h200/served_decode/served_decode_mooncake_conversation_120")
MOONCAKE = "mooncake_conversation_120"
SMS = 132                 # H200 SMs: FlashInfer MLA plan units for 16 heads a rank (sim.costmodel.mla_kv_split)
RATE_S = 0.87e-6          # s per makespan token, KVSplitExcess.fit on decode.csv (README)
GRID = capture_batch_sizes(1024)


class GraphProfile:
    """decode.csv's graph rows: the batch-only part (context 128) and each batch's equal-context makespans."""

    def __init__(self, directory: Path = PROFILE) -> None:
        d = pd.read_csv(directory / "decode.csv")
        self.rows = d[d["path"] == "graph"]
        low = self.rows[self.rows["context_tokens"] == 128].set_index("batch_size")["device_s"].sort_index()
        self._low_b, self._low_t = low.index.to_numpy(float), low.to_numpy()
        self._spans: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def low(self, batch: float) -> float:
        """Step time at 128-token contexts, linear in batch between the measured sizes (n real rows, no padding)."""
        return float(np.interp(batch, self._low_b, self._low_t))

    def interpolated_span(self, batch: int, row_context: float) -> float:
        """Makespan (KV tokens) of the grid's equal-context points, interpolated as the table interpolates time."""
        if batch not in self._spans:
            xs = np.sort(self.rows[self.rows["batch_size"] == batch]["context_tokens"].to_numpy())
            self._spans[batch] = xs, np.array([makespan_tokens(np.full(batch, int(c), np.int64), SMS) for c in xs], float)
        xs, spans = self._spans[batch]
        return float(np.interp(row_context, xs, spans)) if row_context <= xs[-1] else spans[-1] * row_context / xs[-1]


def decode_steps(real_root: Path, profile: GraphProfile) -> pd.DataFrame:
    """One row per decode-only step (padded batch <= 128) of every real run: measured, profiled price (device part, as
    experiments.fidelity_table prices real plans) and the terms of the candidate corrections."""
    out = []
    for run in sorted(p for p in real_root.iterdir() if p.name in ALL_WORKLOADS):
        cfg = compose_config(["mode=sim", "costmodel=profiled", "costmodel.padding_rows=as_real"] + ALL_WORKLOADS[run.name])
        cm = build_cost_model(cfg, build_core(cfg))
        shapes = read_shapes(run)
        steps = pd.read_parquet(run / "steps.parquet")
        measured = (steps["end_s"] - steps["start_s"]).to_numpy()
        for i, s in enumerate(shapes):
            n = s.num_decode_reqs
            pb = padded_size(n, GRID) if s.is_decode_only else None
            if pb is None or pb > 128:
                continue
            lens = np.asarray(s.decode_context_lens, dtype=np.int64)
            pad = np.ones(pb - n, dtype=np.int64)
            own = makespan_tokens(np.concatenate([lens, pad]), SMS) if len(lens) == n else np.nan
            equal = makespan_tokens(np.concatenate([equal_split(int(s.decode_context_tokens), n), pad]), SMS)
            equal_pb = makespan_tokens(equal_split(int(s.decode_context_tokens + pb - n), pb), SMS)
            row_ctx = (s.decode_context_tokens + pb - n) / pb
            interp = profile.interpolated_span(pb, row_ctx)
            table = cm.graph
            j = table.batches.index(pb) if pb in table.batches else None
            out.append(dict(
                run=run.name, step_id=int(steps["step_id"].iloc[i]), n=n, pb=pb, fill=pb - n, row_ctx=row_ctx,
                mean_ctx=s.decode_context_tokens / n, shared_frac=s.decode_shared_tokens / s.decode_context_tokens,
                cv=float(lens.std() / lens.mean()) if len(lens) == n else np.nan,
                max_mean=float(lens.max() / lens.mean()) if len(lens) == n else np.nan,
                inside=bool(j is not None and row_ctx <= table.curves[j].max_x),
                q_own=own * SMS / (row_ctx * pb), q_grid=interp * SMS / (row_ctx * pb),
                measured_s=measured[i], price_s=cm.step_time_s(s) - cm.host_time_s(s),
                pad_s=profile.low(pb) - profile.low(min(n + 1, pb)),      # padding rows route alike: ~one row
                split_s=RATE_S * (own - interp),                          # own plan vs the grid points' plans
                split_eq_s=RATE_S * (own - equal),                        # costmodel.decode_kv_split=flashinfer_mla
                dense_s=RATE_S * (equal_pb - interp)))                    # a dense equal-context grid (emulated)
    frame = pd.DataFrame(out)
    frame["ratio"] = frame["price_s"] / frame["measured_s"]
    return frame


def summarize(ratio: pd.Series) -> dict:
    err = (ratio - 1).abs()
    return {"steps": len(ratio), "price/meas": ratio.median(), "err_med": err.median(), "err_p90": err.quantile(0.9),
            "err_sum": err.sum()}


def binned(frame: pd.DataFrame, by) -> pd.DataFrame:
    table = frame.groupby(by, observed=True)["ratio"].apply(lambda r: pd.Series(summarize(r))).unstack()
    table["share_of_err"] = table["err_sum"] / frame["ratio"].sub(1).abs().sum()
    return table.drop(columns="err_sum")


def linearity(profile: GraphProfile, batches=range(8, 129, 8)) -> pd.DataFrame:
    """Each batch's middle context points against the straight line through their neighbours (raw, and after the
    attention plans' makespans are taken out at RATE_S): how far linear interpolation in context can be off."""
    rows = []
    for b in [4, 8, 12] + [x for x in batches if x > 12]:
        pts = profile.rows[(profile.rows["batch_size"] == b) & (profile.rows["context_tokens"] >= 4096)]
        pts = pts.sort_values("context_tokens")
        xs, ys = pts["context_tokens"].to_numpy(float), pts["device_s"].to_numpy()
        spans = np.array([makespan_tokens(np.full(b, int(c), np.int64), SMS) for c in xs], float)
        for k in range(1, len(xs) - 1):
            w = (xs[k] - xs[k - 1]) / (xs[k + 1] - xs[k - 1])
            line, flat = (1 - w) * ys[k - 1] + w * ys[k + 1], ys - RATE_S * spans
            rows.append({"batch": b, "lo": int(xs[k - 1]), "mid": int(xs[k]), "hi": int(xs[k + 1]),
                         "mid_ms": 1e3 * ys[k], "line_ms": 1e3 * line, "mid/line": ys[k] / line,
                         "mid/line_span_removed": flat[k] / ((1 - w) * flat[k - 1] + w * flat[k + 1])})
    return pd.DataFrame(rows)


def probe_oracles(profile_cm_graph) -> tuple[pd.DataFrame, dict]:
    """The served-decode probe's 40 Mooncake steps (an earlier run): today's table, the probe's equal-context time
    (an ideal dense equal-context grid at the step's own rows) and its own-context time, against the step's measured
    time, raw and after one scale (median measured / probe own-context time)."""
    p = pd.read_csv(f"{PROBE}.csv").merge(pd.read_parquet(f"{PROBE}_contexts.parquet"), on="step_id")
    table = []
    for r in p.itertuples(index=False):
        n = len(r.contexts)
        pb = padded_size(n, GRID)
        t, _ = profile_cm_graph.lookup(pb, np.array([float(sum(r.contexts) + pb - n)]))
        table.append(1e3 * t[0])
    p["table_ms"], p["pb"] = table, [padded_size(len(c), GRID) for c in p["contexts"]]
    k = float((p["measured_ms"] / p["served_ms"]).median())
    err = lambda x: {"med": float((x - 1).abs().median()), "p90": float((x - 1).abs().quantile(0.9))}  # noqa: E731
    out = {"scale_meas_over_probe": k,
           "table_vs_measured": err(p["table_ms"] / p["measured_ms"]),
           "equal_oracle_vs_measured": err(p["equal_ms"] / p["measured_ms"]),
           "served_oracle_vs_measured": err(p["served_ms"] / p["measured_ms"]),
           "equal_oracle_scaled": err(k * p["equal_ms"] / p["measured_ms"]),
           "served_oracle_scaled": err(k * p["served_ms"] / p["measured_ms"]),
           "table_vs_probe_equal": err(p["table_ms"] / p["equal_ms"]),
           "table_vs_probe_served": err(p["table_ms"] / p["served_ms"])}
    by_pb = p.assign(table_over_equal=p["table_ms"] / p["equal_ms"], served_over_equal=p["served_ms"] / p["equal_ms"],
                     measured_over_served=p["measured_ms"] / p["served_ms"]).groupby("pb")[
        ["table_over_equal", "served_over_equal", "measured_over_served"]].median()
    return by_pb.assign(steps=p.groupby("pb").size()), out


def candidates(frame: pd.DataFrame) -> pd.DataFrame:
    """|price / measured - 1| median / p90 per run for the current price and the candidate corrections."""
    models = {"current": frame["price_s"],
              "dense equal-context grid (emulated)": frame["price_s"] + frame["dense_s"],
              "decode_kv_split=flashinfer_mla": frame["price_s"] + frame["split_eq_s"],
              "split vs grid plans": frame["price_s"] + frame["split_s"],
              "padding rows (n+1)": frame["price_s"] - frame["pad_s"],
              "padding rows + split vs grid plans": frame["price_s"] - frame["pad_s"] + frame["split_s"]}
    rows = []
    for name, price in models.items():
        err = (price / frame["measured_s"] - 1).abs()
        for run, e in err.groupby(frame["run"]):
            rows.append({"model": name, "run": run, "cell": f"{100 * e.median():.1f} / {100 * e.quantile(0.9):.1f}"})
    return pd.DataFrame(rows).pivot(index="model", columns="run", values="cell").loc[list(models)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", type=Path, default=Path("experiments/results/h200/fidelity/real"))
    parser.add_argument("--out-csv", type=Path, default=None)
    args = parser.parse_args()
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 30)
    fmt = lambda x: f"{x:.3f}"  # noqa: E731
    profile = GraphProfile()
    frame = decode_steps(args.real, profile)
    if args.out_csv is not None:
        frame.to_csv(args.out_csv, index=False)
    m = frame[frame["run"] == MOONCAKE].copy()
    print(f"== {MOONCAKE}: decode-only steps (padded batch <= 128)")
    print(pd.Series(summarize(m["ratio"])).to_string(float_format=fmt))
    print("\n== by padded batch\n" + binned(m, "pb").to_string(float_format=fmt))
    print("\n== by padded batch x padding rows (pb - n)\n" + binned(m, ["pb", "fill"]).to_string(float_format=fmt))
    m["ctx_bin"] = pd.cut(m["row_ctx"], [0, 4096, 8192, 12288, 16384, 24576, 32768, 65536, 1e9])
    print("\n== by context per padded row\n" + binned(m, "ctx_bin").to_string(float_format=fmt))
    m["cv_bin"] = pd.cut(m["cv"], [-0.01, 0.5, 0.8, 1.0, 1.2, 1.5])
    print("\n== by coefficient of variation of the step's contexts\n" + binned(m, "cv_bin").to_string(float_format=fmt))
    m["maxmean_bin"] = pd.cut(m["max_mean"], [0, 2, 4, 6, 8])
    print("\n== by max / mean context\n" + binned(m, "maxmean_bin").to_string(float_format=fmt))
    m["shared_bin"] = pd.cut(m["shared_frac"], [-0.001, 0, 0.02, 0.04, 0.08, 1])
    print("\n== by shared-prefix share of the KV read\n" + binned(m, "shared_bin").to_string(float_format=fmt))
    print("\n== by inside the grid (False: batch-1 steps past 65,536 tokens, scaled roofline)\n"
          + binned(m, "inside").to_string(float_format=fmt))
    print("\n== attention plan efficiency (makespan / ideal) by padded batch: steps' own vs the grid points'\n"
          + m.groupby("pb")[["q_own", "q_grid", "row_ctx", "cv"]].median().to_string(float_format=fmt))
    print("\n== other runs: price / measured by padded batch x padding rows (pb 8-48, short contexts)")
    o = frame[(frame["run"] != MOONCAKE) & frame["pb"].between(8, 48) & ~frame["run"].str.startswith("shared")]
    t = binned(o, ["pb", "fill"])
    print(t[t["steps"] >= 10]["price/meas"].unstack(0).to_string(float_format=fmt))
    print("\n== profile linearity in context (graph decode.csv, contexts >= 4096)")
    lin = linearity(profile)
    print(lin.to_string(index=False, float_format=fmt))
    cfg = compose_config(["mode=sim", "costmodel=profiled", "costmodel.padding_rows=as_real"] + ALL_WORKLOADS[MOONCAKE])
    by_pb, oracle = probe_oracles(build_cost_model(cfg, build_core(cfg)).graph)
    print("\n== served-decode probe (40 steps of an earlier Mooncake run): medians by padded batch\n"
          + by_pb.to_string(float_format=fmt))
    for key, value in oracle.items():
        print(f"  {key:<28} {value if isinstance(value, float) else {k: round(v, 4) for k, v in value.items()}}")
    print("\n== candidate corrections: decode-only |price / measured - 1| median / p90 (%) per real run\n"
          + candidates(frame).to_string())
    res = (m["measured_s"] - (m["price_s"] - m["pad_s"])) * 1e3
    a = np.column_stack([np.ones(len(m)), m["split_s"] / RATE_S / 1e3])
    coef = np.linalg.lstsq(a, res.to_numpy(), rcond=None)[0]
    fitted = m["price_s"] - m["pad_s"] + (a @ coef) / 1e3
    err = (fitted / m["measured_s"] - 1).abs()
    print(f"\n== Mooncake, in sample: measured - (price - padding) = {coef[0]:+.3f} ms + {coef[1]:.3f} us x (own - grid "
          f"makespan tokens): |err| median {err.median():.3f}, p90 {err.quantile(0.9):.3f}")


if __name__ == "__main__":
    main()
