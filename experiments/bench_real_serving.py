"""`mode=real` serving benchmarks on one GPU, measured inside serving runs: offline throughput at
fixed lengths (overlap on and off, piecewise CUDA graphs on and off, side by side), online Poisson
arrivals with short prompts, decode over long contexts, batch-1 decode, the default workload, and the
offline Engine against the same work through the driver. One model runner (weights, CUDA graphs, JIT
warm-up) serves every scenario; each gets a fresh scheduler ("_no_piecewise" scenarios set the runner's
piecewise graphs aside for their run).

  python experiments/bench_real_serving.py --out experiments/results/h200/real_serving [--quick]

Writes per scenario DIR/<name>/{requests,steps}.parquet + summary.json, and DIR/serving.csv and
DIR/step_roofline.csv (measured step time over its roofline, by step kind and size).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
from hydra.utils import instantiate

from experiments.compose import compose_config
from experiments.step_roofline import device_idle_share, ideal_model, ideal_step_s, step_kind_table
from runtime.build import build_core
from runtime.driver import RealDriver
from runtime.metrics import summarize
from runtime.records_io import requests_frame, steps_frame

FIXED = ["workload=random", "workload.range_ratio=1.0", "real.as_fast_as_possible=true"]

# Poisson arrivals, prompts of 128-512 tokens: prefill steps of a few hundred tokens between decodes
ONLINE = ["workload=random", "workload.num_requests=400", "workload.input_len=512", "workload.output_len=128",
          "workload.range_ratio=0.25", "workload.request_rate=16"]

# name -> (overrides, overlap)
SCENARIOS = {
    "offline_1000in_1000out": (FIXED + ["workload.num_requests=500", "workload.input_len=1000",
                                        "workload.output_len=1000"], True),
    "offline_1000in_1000out_no_overlap": (FIXED + ["workload.num_requests=500", "workload.input_len=1000",
                                                   "workload.output_len=1000"], False),
    "offline_1000in_100out": (FIXED + ["workload.num_requests=1000", "workload.input_len=1000",
                                       "workload.output_len=100"], True),
    "offline_1000in_100out_no_overlap": (FIXED + ["workload.num_requests=1000", "workload.input_len=1000",
                                                  "workload.output_len=100"], False),
    "offline_1000in_100out_no_piecewise": (FIXED + ["workload.num_requests=1000", "workload.input_len=1000",
                                                    "workload.output_len=100"], True),
    "online_poisson_16rps": (ONLINE, True),
    "online_poisson_16rps_no_piecewise": (ONLINE, True),
    "long_context_12k": (FIXED + ["workload.num_requests=96", "workload.input_len=12000",
                                  "workload.output_len=256"], True),
    "batch1_decode": (FIXED + ["workload.num_requests=4", "workload.input_len=1000", "workload.output_len=256",
                               "scheduler.max_running_requests=1"], True),
    "default_shared_prefix": ([], True),
}
QUICK = ("offline_1000in_100out", "batch1_decode", "default_shared_prefix")


def run_scenario(runner, base: list[str], overrides: list[str], overlap: bool, out: Path) -> dict:
    cfg = compose_config(base + overrides + ["progress=false", "print_summary=false"])
    core = build_core(cfg)
    specs = instantiate(cfg.workload).requests()
    started = time.perf_counter()
    outcome = RealDriver(core.scheduler, runner, as_fast_as_possible=bool(cfg.real.as_fast_as_possible),
                         progress=False, overlap=overlap).run(specs)
    wall_s = time.perf_counter() - started
    requests, steps = requests_frame(outcome.requests), steps_frame(outcome.steps)
    summary = summarize(requests, steps, mode="real", wall_time_s=wall_s)
    out.mkdir(parents=True, exist_ok=True)
    requests.to_parquet(out / "requests.parquet")
    steps.to_parquet(out / "steps.parquet")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    summary["_steps"] = steps
    summary["_model"], summary["_hardware"] = core.model, core.hardware
    return summary


def engine_vs_driver(runner, base: list[str]) -> dict:
    """Engine.generate of 64 x (1000 in, 100 out) against the same specs through RealDriver, both on
    the one runner (the Engine builds its runner with the same factory as mode=real)."""
    from runtime.engine.engine import Engine

    cfg = compose_config(base + ["progress=false"])
    engine = Engine(cfg, runner=runner)
    specs = instantiate(compose_config(base + FIXED + ["workload.num_requests=64", "workload.input_len=1000",
                                                       "workload.output_len=100"]).workload).requests()
    prompts = [list(s.input_ids) for s in specs]
    params = {"max_new_tokens": 100, "ignore_eos": True, "temperature": 0.0}
    engine.generate(input_ids=prompts[:4], sampling_params=params)          # warm
    started = time.perf_counter()
    engine.generate(input_ids=prompts, sampling_params=params)
    engine_s = time.perf_counter() - started
    core = build_core(cfg)
    started = time.perf_counter()
    RealDriver(core.scheduler, engine.runner, as_fast_as_possible=True, progress=False,
               overlap=bool(cfg.overlap)).run(specs)
    driver_s = time.perf_counter() - started
    return {"engine_generate_s": engine_s, "driver_s": driver_s, "ratio": engine_s / driver_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="deepseek_v2_lite")
    parser.add_argument("--quick", action="store_true", help="three short scenarios only")
    parser.add_argument("--only", nargs="*", help="scenario names to run")
    parser.add_argument("--engine", action="store_true", help="also time Engine.generate against the driver")
    parser.add_argument("--rates", nargs="*", type=float, help="instead of the named scenarios: one replay per "
                        "request rate of the workload given by --workload")
    parser.add_argument("--workload", nargs="*", default=[], help="workload overrides for --rates")
    parser.add_argument("overrides", nargs="*", help="config overrides for every scenario (e.g. hardware=cpu)")
    args = parser.parse_args()
    from runtime.engine.build_runner import build_model_runner

    out = Path(args.out)
    base = ["mode=real", f"model={args.model}"] + list(args.overrides)
    started = time.perf_counter()
    runner = build_model_runner(compose_config(base + ["progress=true"]), build_core(compose_config(base)))
    setup_s = time.perf_counter() - started
    print(f"runner ready in {setup_s:.1f} s (load {runner.load_time_s:.1f} s incl. graph capture, warm-up "
          f"{runner.warmup_s:.1f} s)", flush=True)
    names = args.only or (QUICK if args.quick else list(SCENARIOS))
    if args.rates:
        for rate in args.rates:
            SCENARIOS[f"rate_{rate:g}"] = (list(args.workload) + [f"workload.request_rate={rate}"], True)
        names = [f"rate_{rate:g}" for rate in args.rates]
    rows, kinds = [], []
    for name in names:
        overrides, overlap = SCENARIOS[name]
        piecewise = runner.piecewise
        if name.endswith("_no_piecewise"):
            runner.piecewise = None
        try:
            s = run_scenario(runner, base, overrides, overlap, out / name)
        finally:
            runner.piecewise = piecewise
        steps = s.pop("_steps")
        ideal = ideal_step_s(steps, ideal_model(s.pop("_model"), s.pop("_hardware")))
        table = step_kind_table(steps, ideal).assign(scenario=name)
        kinds.append(table)
        decode = steps[(steps["num_prefill_tokens"] == 0)]
        rows.append({"scenario": name, "overlap": overlap, "piecewise": piecewise is not None
                     and not name.endswith("_no_piecewise"), "requests": s["num_requests"],
                     "duration_s": s["duration_s"], "req_per_s": s["throughput"]["requests_per_s"],
                     "out_tok_per_s": s["throughput"]["output_tokens_per_s"],
                     "ttft_mean_ms": 1e3 * s["ttft_s"]["mean"], "ttft_p99_ms": 1e3 * s["ttft_s"]["p99"],
                     "tpot_mean_ms": 1e3 * s["tpot_s"]["mean"],
                     "decode_step_p50_ms": 1e3 * (decode["end_s"] - decode["start_s"]).median(),
                     "device_idle_pct": 100 * device_idle_share(steps), "steps": len(steps)})
        print(pd.DataFrame(rows[-1:]).to_string(index=False), flush=True)
    serving = pd.DataFrame(rows)
    serving.to_csv(out / "serving.csv", index=False)
    kinds_df = pd.concat(kinds, ignore_index=True)
    kinds_df.to_csv(out / "step_roofline.csv", index=False)
    if args.engine:
        e = engine_vs_driver(runner, base)
        (out / "engine_vs_driver.json").write_text(json.dumps(e, indent=2))
        print(f"Engine.generate {e['engine_generate_s']:.2f} s vs driver {e['driver_s']:.2f} s: {e['ratio']:.2f}x")
    print(serving.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    print(kinds_df.to_string(index=False, float_format=lambda x: f"{x:.2f}"))


if __name__ == "__main__":
    main()
