"""The fidelity workloads, run for real and simulated with the same overrides and seed: one model runner
(weights, CUDA graphs, warm-up) serves every real run, each with a fresh scheduler, writing what
`mode=real` writes (records, summary, predicted_s, step_shapes.parquet: every step's full shape, so any
cost model can be scored later on the real plans) and launch_times.parquet (each step's launch on the host
clock, experiments.launch_timer). With TWINSERVE_LAUNCH_PARTS=1 the launches carry their parts, and under tp > 1
the other ranks time every step they run (follower_steps_rank<r>.parquet at --out). `--sim` runs `mode=sim` for each
workload and cost model instead (no GPU).

  python experiments/fidelity_runs.py --real --out /tmp/fidelity/real            # GPU
  python experiments/fidelity_runs.py --real --out /tmp/fidelity/real_tp2 --base tp=2   # 2 GPUs: ranks spawned once
  python experiments/fidelity_runs.py --sim --out /tmp/fidelity/sim              # CPU: profiled + roofline
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from hydra.utils import instantiate

from experiments.compose import compose_config
from experiments.launch_timer import LAUNCH_TIMES_FILE, LaunchTimer
from runtime.build import build_core, leaked_slots
from runtime.metrics import step_prediction_error, summarize
from runtime.records_io import requests_frame, steps_frame, write_run
from sim.predictor import build_cost_model, step_predictor
from sim.step_shapes import shapes_frame, write_step_shapes

TRACES = Path(__file__).resolve().parents[1] / ".traces"      # heads of ../shared/data traces (carried to the GPU)
RANDOM = ["workload=random"]
WORKLOADS = {       # in the order the GPU job runs them
    "shared_prefix_lpm": [],
    "random_poisson_4rps": RANDOM + ["workload.request_rate=4", "workload.num_requests=200"],
    "random_poisson_32rps": RANDOM + ["workload.request_rate=32", "workload.num_requests=400"],
    "random_long_8k_2rps": RANDOM + ["workload.input_len=8000", "workload.output_len=256", "workload.range_ratio=0.5",
                                     "workload.request_rate=2", "workload.num_requests=80"],
    "shared_prefix_fcfs": ["policy=fcfs"],
    "azure_conversation_300_4x": ["workload=azure", "workload.num_requests=300", "workload.time_scale=0.25",
                                  f"workload.path={TRACES / 'azure_conv_head.csv'}"],
    "mooncake_conversation_120": ["workload=mooncake_conversation", "workload.num_requests=120",
                                  f"workload.path={TRACES / 'mooncake_conversation_head.jsonl'}"],
}
# shared prefixes of other sizes than the default workload's (decode over shared KV, out of the profile's grid)
SHARED_PREFIX_WORKLOADS = {
    "shared_prefix_4x32_4k": ["workload.num_groups=4", "workload.prompts_per_group=32", "workload.system_prompt_len=4096",
                              "workload.question_len=256"],
    "shared_prefix_32x8_1k_16rps": ["workload.num_groups=32", "workload.prompts_per_group=8",
                                    "workload.system_prompt_len=1024", "workload.output_len=512",
                                    "workload.range_ratio=0.5", "workload.request_rate=16"],
}
# held out: never used to calibrate or choose a cost-model rule, run to see how the model does on traffic it was
# not shaped on (other traces, another request rate and policy)
VALIDATION_WORKLOADS = {
    "sharegpt_multiturn_300": ["workload=sharegpt_multiturn",
                               f"workload.path={TRACES / 'sharegpt-llama-3.1-8b-300-sps10.jsonl'}"],
    "arxiv_96_2rps": ["workload=arxiv", "workload.num_requests=96", "workload.request_rate=2",
                      f"workload.path={TRACES / 'arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv'}"],
    "azure_code_150_2x": ["workload=azure_code", "workload.num_requests=150", "workload.time_scale=0.5",
                          f"workload.path={TRACES / 'AzureLLMInferenceTrace_code.csv'}"],
    "random_2k_16rps_fcfs": RANDOM + ["policy=fcfs", "workload.input_len=2048", "workload.output_len=128",
                                      "workload.range_ratio=0.8", "workload.request_rate=16", "workload.num_requests=300"],
}
ALL_WORKLOADS = {**WORKLOADS, **SHARED_PREFIX_WORKLOADS, **VALIDATION_WORKLOADS}
COST_MODELS = ("profiled", "roofline", "roofline_fitted")
QUIET = ["progress=false", "print_summary=false"]
LAUNCH_PARTS_ENV = "TWINSERVE_LAUNCH_PARTS"     # "1": launch_times.parquet also times each launch's parts
FOLLOWER_TIMES_ENV = "TWINSERVE_FOLLOWER_TIMES"   # where tp > 1 followers write their step timings (set for them)
FOLLOWER_TIMES_FILE = "follower_steps_rank{rank}.parquet"


def launch_parts(runner):
    """The PartTimers on `runner` (runtime.profile.launch_parts), installed at its first workload."""
    from runtime.profile.launch_parts import PartTimers, install

    if getattr(runner, "launch_parts", None) is None:
        runner.launch_parts = PartTimers()
        install(runner, runner.launch_parts, leader=True)
    return runner.launch_parts


def run_real_workload(runner, overrides: list[str], out: Path) -> dict:
    """One workload through `runner` with a fresh scheduler; `overrides` include any --base ones."""
    from runtime.driver import RealDriver
    from runtime.gc_pauses import GCPauses, serving_gc

    cfg = compose_config(["mode=real", "costmodel=profiled"] + overrides + QUIET)
    core = build_core(cfg)
    shapes: list[dict] = []
    predict = step_predictor(build_cost_model(cfg, core), overlap=bool(cfg.overlap), shapes=shapes)

    pauses = GCPauses(float(cfg.real.gc_warning_threshold_s))
    # each step's launch on the host clock (launch_times.parquet); with TWINSERVE_LAUNCH_PARTS=1 its parts too
    timer = LaunchTimer(runner, parts=launch_parts(runner) if os.environ.get(LAUNCH_PARTS_ENV) == "1" else None)
    driver = RealDriver(core.scheduler, timer, as_fast_as_possible=bool(cfg.real.as_fast_as_possible),
                        progress=False, overlap=bool(cfg.overlap), predict=predict)
    specs = instantiate(cfg.workload).requests()
    started = time.perf_counter()
    with serving_gc(pauses, bool(cfg.real.freeze_gc)):      # as mode=real serves (runtime/app.py)
        outcome = driver.run(specs)
    requests, steps = requests_frame(outcome.requests), steps_frame(outcome.steps)
    summary = summarize(requests, steps, mode="real", wall_time_s=time.perf_counter() - started)
    summary.update(kv_capacity_tokens=core.kv_capacity_tokens, leaked_kv_slots=leaked_slots(core.scheduler),
                   step_prediction_error=step_prediction_error(steps),
                   overrides=overrides, gc=pauses.summary())
    write_run(out, requests, steps, summary, plots=False)
    write_step_shapes(out, shapes_frame(shapes))
    timer.frame().to_parquet(Path(out) / LAUNCH_TIMES_FILE, index=False)
    return summary


def run_real(out: Path, names: list[str], base: list[str]) -> None:
    """One runner for every workload: in this process on one GPU; over a layout of several GPUs (`--base tp=2`)
    its ranks are spawned once and the TP leader serves every workload through its runner (each step handed to
    the group), as `mode=real` would serve each alone, writing the same files. DP layouts run `mode=real` per
    workload (the router lives in the launching process)."""
    from runtime.app import run_real as run_mode_real
    from runtime.build import build_layout
    from runtime.engine.build_runner import build_model_runner

    cfg = compose_config(["mode=real"] + base + QUIET)
    layout = build_layout(cfg)
    if layout.num_gpus > 1 and layout.dp == 1:
        summaries = run_on_ranks(cfg, out, names, base)
    elif layout.num_gpus > 1:
        summaries = {name: run_mode_real(compose_config(["mode=real", "costmodel=profiled"] + base + ALL_WORKLOADS[name]
                                                        + QUIET), out_dir=out / name) for name in names}
    else:
        runner = build_model_runner(cfg, build_core(cfg))
        print(f"runner: load {runner.load_time_s:.1f} s, warm-up {runner.warmup_s:.1f} s", flush=True)
        summaries = {}
        for name in names:
            summaries[name] = run_real_workload(runner, base + ALL_WORKLOADS[name], out / name)
            print_summary(name, summaries[name])
        return
    for name, summary in summaries.items():
        print_summary(name, summary)


def print_summary(name: str, s: dict) -> None:
    print(f"{name}: {s['num_finished']} req, {s['duration_s']:.1f} s, TTFT p50 {s['ttft_s']['p50']} s, "
          f"TPOT mean {s['tpot_s']['mean']} s, step error {s['step_prediction_error']}, gc {s.get('gc')}", flush=True)


def run_on_ranks(cfg, out: Path, names: list[str], base: list[str]) -> dict[str, dict]:
    """Spawn the layout's ranks once (runtime.distributed, as `mode=real` spawns them); the TP leader runs
    `lead_workloads`, the others every step it launches. Returns each workload's summary. A rank that dies stops
    the run naming it (RankFailed)."""
    from runtime.distributed.app import check_layout, run_job
    from runtime.profile.ranks import follow_steps

    core = build_core(cfg)
    check_layout(core, 1)
    job_cfg = {"fidelity_job": {"out": str(out), "names": list(names), "base": list(base)}}
    follow = follow_steps
    if os.environ.get(LAUNCH_PARTS_ENV) == "1":       # the followers time their steps too (spawned: they inherit it)
        os.environ[FOLLOWER_TIMES_ENV] = str(out)
        follow = follow_timed
    return run_job(cfg, core, out, (lead_workloads, follow), "fidelity", job_cfg)


def follow_timed(runner, channel) -> dict:
    """A tp rank other than the leader under TWINSERVE_LAUNCH_PARTS=1: runtime.profile.ranks.follow_steps, each step
    timed with its parts (the wait in recv before it included) on time.perf_counter, the leader's launch clock
    (launch_times.parquet's clock_origin_s), written to OUT/follower_steps_rank<r>.parquet as the job ends: every
    step of every workload in order, warm-up included."""
    import pandas as pd
    import torch.distributed as dist

    from runtime.profile.launch_parts import PartTimers, install
    from runtime.profile.ranks import follow_steps

    timers = PartTimers()
    install(runner, timers, leader=False)
    rows, run = [], runner.run

    def timed_run(inputs, *args, **kwargs):
        start = time.perf_counter()
        try:
            return run(inputs, *args, **kwargs)
        finally:
            rows.append({"run_start_perf_s": start, "run_ms": 1e3 * (time.perf_counter() - start),
                         "new_tokens": int(sum(len(ids) for ids in inputs.batch.new_ids)), **timers.ms()})
            timers.reset()

    runner.run = timed_run
    try:
        return follow_steps(runner, channel)
    finally:
        out = Path(os.environ[FOLLOWER_TIMES_ENV]) / FOLLOWER_TIMES_FILE.format(rank=dist.get_rank())
        pd.DataFrame(rows).to_parquet(out, index=False)


def lead_workloads(task, cfg, core, runner) -> dict[str, dict]:
    """The TP leader (a spawned rank): every workload of the job through `runner`, whose launches reach the group;
    each with a fresh scheduler, as the one-GPU path serves them."""
    job = cfg.fidelity_job
    base = list(job.base)
    return {name: run_real_workload(runner, base + ALL_WORKLOADS[name], Path(job.out) / name) for name in job.names}


def run_sims(out: Path, names: list[str], base: list[str]) -> None:
    from sim.app import run_sim

    for name in names:
        for cost in COST_MODELS:
            cfg = compose_config(["mode=sim", f"costmodel={cost}"] + base + ALL_WORKLOADS[name] + QUIET)
            run_sim(cfg, out_dir=out / cost / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true")
    parser.add_argument("--sim", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", default=list(WORKLOADS), choices=list(ALL_WORKLOADS),
                        help="workloads to run (default: the fidelity table's)")
    parser.add_argument("--base", nargs="*", default=[], help="overrides for every run (e.g. a tiny CPU model)")
    args = parser.parse_args()
    if args.real:
        run_real(args.out, args.only, args.base)
    if args.sim:
        run_sims(args.out, args.only, args.base)


if __name__ == "__main__":
    main()
