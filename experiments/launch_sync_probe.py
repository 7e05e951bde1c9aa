"""Does `ModelRunner.launch` wait for the device? Builds the runner as `mode=real` does and, per step
kind (graph-replayed decode, eager decode, prefill), (1) launches a step behind a long sleep kernel: a
launch that returns before the sleep ends never waits for earlier work; one that waits shows the sleep
in its host time; (2) times each host-side part of a launch behind a sleep, to name the part that
waits; (3) lists every synchronising call torch reports (`torch.cuda.set_sync_debug_mode`) with its
Python call site; (4) times steps the way `mode=profile` does (launch n+1, then wait for n).

  python experiments/launch_sync_probe.py model=deepseek_v2_lite [--batch 1 64] [--context 1024] [--out F]
Imports torch; CUDA only.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SLEEP_S = 0.05     # the sleep kernel a launch is made behind


def part_times(runner, plan, cycles: int) -> dict[str, float]:
    """Host ms of each part of a launch, each behind its own sleep (prepare, to_device, forward,
    sampling, the sampled tokens into the future ring, the token copy to the host)."""
    import torch

    from kernels.event_timing import behind_sleep_ms
    from runtime.engine.model_runner import GREEDY
    state: dict = {}
    out = {"prepare_ms": behind_sleep_ms(lambda: state.update(inputs=runner.prepare(plan)), cycles)}
    inputs = state["inputs"]
    out["to_device_ms"] = behind_sleep_ms(lambda: state.update(fb=runner.batches.to_device(inputs.batch)), cycles)
    graphs = runner.graphs
    bs = graphs.bucket(state["fb"]) if graphs is not None else None
    if bs is not None:               # the decode graph's replay, part by part (forward below does all three)
        out["graph_fill_ms"] = behind_sleep_ms(lambda: state.update(indptr=graphs.inputs.fill(state["fb"], bs)), cycles)
        out["graph_plan_ms"] = behind_sleep_ms(lambda: graphs._plan(bs, state["indptr"]), cycles)
        out["graph_replay_ms"] = behind_sleep_ms(lambda: graphs.graphs[bs].replay(), cycles)
    out["forward_ms"] = behind_sleep_ms(lambda: state.update(logits=runner.forward(state["fb"])), cycles)
    rows = inputs.sample_rows
    sampling = inputs.sampling if inputs.sampling is not None else [GREEDY] * len(rows)
    out["sample_ms"] = behind_sleep_ms(lambda: state.update(ids=runner.sampler.sample(
        state["logits"][rows], sampling, inputs.output_positions)), cycles)
    ring = inputs.ring
    out["ring_pageable_ms"] = behind_sleep_ms(lambda: torch.from_numpy(ring).to(runner.device, non_blocking=True), cycles)
    out["ring_pinned_ms"] = behind_sleep_ms(lambda: torch.from_numpy(ring).pin_memory().to(runner.device, non_blocking=True),
                                         cycles)
    out["host_copy_ms"] = behind_sleep_ms(lambda: torch.empty(state["ids"].shape, dtype=torch.long,
                                                           pin_memory=True).copy_(state["ids"], non_blocking=True),
                                       cycles)
    return out


def sync_sites(runner, plan) -> list[str]:
    """Python call sites of the synchronising calls torch reports during one launch."""
    import torch
    sites: list[str] = []

    def record(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1] if "/warnings.py" not in f.filename]
        ours = [f for f in frames if str(ROOT) in f.filename and "launch_sync_probe" not in f.filename]
        where = ours[-1] if ours else frames[-1]
        sites.append(f"{Path(where.filename).relative_to(ROOT) if str(ROOT) in where.filename else where.filename}"
                     f":{where.lineno} {where.line} -- {str(message).splitlines()[0][:80]}")

    saved = warnings.showwarning
    warnings.showwarning = record
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            torch.cuda.set_sync_debug_mode("warn")
            try:
                step = runner.launch(plan)
            finally:
                torch.cuda.set_sync_debug_mode("default")
    finally:
        warnings.showwarning = saved
    step.wait()
    return sorted(set(sites))


def profile_loop(runner, plan, repeats: int) -> dict[str, float]:
    """mode=profile's timing (launch n+1, then wait n) and the device's busy share over the loop."""
    from runtime.profile.timing import time_plan
    timing = time_plan(runner, plan, repeats)
    return {"profile_device_ms": 1e3 * timing.device_s, "profile_launch_host_ms": 1e3 * timing.launch_host_s}


def plans(core, runner, batches: list[int], context: int):
    """(name, plan, context manager, requests to finish after it or None) for each step kind probed."""
    from contextlib import nullcontext

    from runtime.profile.plans import SyntheticBatch, decode_items, step_plan
    from runtime.profile.timing import eager_decode
    vocab = core.model.vocab_size
    for batch in batches:
        synthetic = SyntheticBatch(f"probe{batch}x{context}", batch, context, 0, vocab)
        yield f"decode_graph_b{batch}", step_plan(decode_items(synthetic.requests, context)), nullcontext, None
        yield f"decode_eager_b{batch}", step_plan(decode_items(synthetic.requests, context)), \
            lambda: eager_decode(runner), synthetic.requests
    synthetic = SyntheticBatch("probe_prefill", 1, 512, 0, vocab)
    yield "prefill_512", step_plan(synthetic.extend_items(512, 0)), nullcontext, synthetic.requests


def main(argv: list[str] | None = None) -> int:
    import torch

    from experiments.compose import compose_config
    from kernels.event_timing import behind_sleep_ms, sleep_cycles
    from runtime.build import build_core
    from runtime.engine.build_runner import build_model_runner
    from runtime.profile.plans import finish
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    cfg = compose_config(["mode=real", "progress=false"] + args.overrides)
    core = build_core(cfg)
    runner = build_model_runner(cfg, core)
    cycles = sleep_cycles(SLEEP_S)
    rows = []
    for name, plan, context_manager, done in plans(core, runner, args.batch, args.context):
        with context_manager():
            for _ in range(3):
                runner.launch(plan).wait()
            launched: list = []      # the launch alone (not its wait) behind the sleep, median of three
            row = {"step": name, "launch_behind_sleep_ms": statistics.median(
                behind_sleep_ms(lambda: launched.append(runner.launch(plan)), cycles) for _ in range(3))}
            for step in launched:
                step.wait()
            row.update(part_times(runner, plan, cycles))
            row["sync_sites"] = sync_sites(runner, plan)
            row.update(profile_loop(runner, plan, args.repeats))
        if done is not None:
            finish(done)
        rows.append(row)
        print(f"{name}: launch behind a {1e3 * SLEEP_S:.0f} ms sleep returned after {row['launch_behind_sleep_ms']:.2f} ms; "
              + ", ".join(f"{k} {v:.2f}" for k, v in row.items() if k.endswith("_ms") and k != "launch_behind_sleep_ms"))
        for site in row["sync_sites"]:
            print(f"    sync: {site}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"overrides": args.overrides, "sleep_ms": 1e3 * SLEEP_S,
                                        "device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
