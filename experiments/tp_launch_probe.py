"""Where a tensor-parallel step's launch spends its host time, on every rank. Spawns the layout's ranks as
`mode=profile` does (runtime.distributed.app.run_job); the leader launches synthetic steps (prefills of
--tokens, graph-replayed decodes of --decode-batch) in four regimes -- back to back (launch n+1, then wait
for n, as `mode=profile` and the overlap loop do), behind a sleep kernel on every rank, on an idle device,
and (prefills) right behind a decode's launch -- and both ranks time each part of every launch: the plan's hand-off (leader: send, others: the
wait in recv), prepare, to_device, the attention plan, graph replays, attention cores, logits, sampling,
the future ring; plus the synchronising calls torch reports on each rank. Rows go to --out as JSON (one
list per rank), a per-regime table of medians is printed.

  python experiments/tp_launch_probe.py --out F [--tokens 8192 2048 512] [--decode-batch 8] tp=2 hardware=h200
Imports torch in the ranks only; CUDA only.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from runtime.profile.launch_parts import PartTimers, install  # noqa: E402

OUT_ENV = "TWINSERVE_TP_PROBE_OUT"     # where each rank writes its rows (spawned ranks inherit it)
SLEEP_S = 0.15                          # the sleep kernel a launch is hidden behind
AHEAD_BATCH = 8                         # the decode batch launched right before an extend (regime after_decode)


class SyncSites:
    """Counts the synchronising calls torch reports (set_sync_debug_mode('warn')) by Python call site (the one
    site both ranks reported on the H200s, worker.py's call into the job, was the mode's prototype notice: no
    torch-visible sync inside a launch)."""

    def __init__(self, on: bool = True) -> None:
        self.sites: collections.Counter = collections.Counter()
        self.on = on

    def __enter__(self):
        import torch
        if not self.on:
            return self
        self._saved = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None):
            if "synchronizing" not in str(message):      # e.g. the mode's own "prototype feature" notice
                return
            frames = [f for f in traceback.extract_stack()[:-1] if "/warnings.py" not in f.filename]
            ours = [f for f in frames if str(ROOT) in f.filename and "tp_launch_probe" not in f.filename]
            where = ours[-1] if ours else frames[-1]
            self.sites[f"{Path(where.filename).name}:{where.lineno} {where.line}"] += 1

        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc) -> None:
        import torch
        if not self.on:
            return
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = self._saved


def probe_plans(core, tokens: list[int], decode_batches: list[int], context: int, first_slot: int):
    """(name, plan, requests to finish after it): one fresh prompt per prefill size, decode batches at `context`,
    their KV from `first_slot` on."""
    from runtime.profile.plans import SyntheticBatch, step_plan
    vocab = core.model.vocab_size
    for n in tokens:
        batch = SyntheticBatch(f"probe-p{n}", 1, n, first_slot, vocab)
        yield f"prefill_{n}", step_plan(batch.extend_items(n, 0)), batch.requests
    for b in decode_batches:
        batch = SyntheticBatch(f"probe-d{b}", b, context, first_slot, vocab)
        yield f"decode_b{b}", step_plan(batch.decode_items(context)), batch.requests


def lead_probe(task, cfg, core, runner) -> dict:
    """The TP leader: each plan warmed, then timed back to back, behind a sleep on every rank, alone, and (prefills)
    launched right behind a decode step's launch, as the overlap loop launches an extend after a decode."""
    import torch

    from kernels.event_timing import sleep_cycles
    from runtime.profile.plans import SyntheticBatch, finish, step_plan
    from runtime.profile.timing import SleepBeforeStep

    job = cfg.tp_probe
    timers = PartTimers()
    install(runner, timers, leader=True)
    tell = runner.step_sender
    cycles = sleep_cycles(SLEEP_S) if runner.device.type == "cuda" else 0
    rows, seq = [], 0

    def launch(name: str, regime: str, plan) -> tuple[dict, object]:
        nonlocal seq
        timers.reset()
        start = time.perf_counter()
        step = runner.launch(plan)
        end = time.perf_counter()
        row = {"rank": 0, "seq": seq, "step": name, "regime": regime, "t_start": start, "launch_ms": 1e3 * (end - start),
               **timers.ms()}
        seq += 1
        return row, step

    cuda = runner.device.type == "cuda"
    syncs = SyncSites(on=cuda)
    context = int(job.context)
    ahead = SyntheticBatch("probe-ahead", AHEAD_BATCH, context, 0, core.model.vocab_size)
    ahead_plan = step_plan(ahead.decode_items(context))
    for _ in range(3):
        launch("decode_ahead", "warm", ahead_plan)[1].wait()
    for name, plan, requests in probe_plans(core, list(job.tokens), list(job.decode_batches), context,
                                            AHEAD_BATCH * context):
        for _ in range(3):                                     # warm: JIT, allocator
            launch(name, "warm", plan)[1].wait()
        launched = []
        for i in range(int(job.steps) + 1):                    # back to back
            with syncs if i == 1 else contextlib.nullcontext():
                row, step = launch(name, "back_to_back", plan)
            if launched:
                wait_start = time.perf_counter()
                launched[-1][1].wait()
                row["wait_prev_ms"] = 1e3 * (time.perf_counter() - wait_start)
            launched.append((row, step))
        for row, step in launched:
            row["device_ms"] = 1e3 * step.wait().duration_s
            rows.append(row)
        for regime in ("behind_sleep", "idle") if cuda else ("idle",):
            for _ in range(3):
                if cuda:
                    torch.cuda.synchronize(runner.device)
                if regime == "behind_sleep":
                    tell(SleepBeforeStep(cycles))
                    torch.cuda._sleep(cycles)
                row, step = launch(name, regime, plan)
                row["device_ms"] = 1e3 * step.wait().duration_s
                rows.append(row)
        if name.startswith("prefill"):
            for _ in range(3):                                 # right behind a decode's launch
                if cuda:
                    torch.cuda.synchronize(runner.device)
                decode_row, decode = launch("decode_ahead", "ahead", ahead_plan)
                row, step = launch(name, "after_decode", plan)
                decode_row["device_ms"] = 1e3 * decode.wait().duration_s
                row["device_ms"] = 1e3 * step.wait().duration_s
                rows.extend([decode_row, row])
        finish(requests)
    finish(ahead.requests)
    return {"rows": rows, "syncs": dict(syncs.sites)}


def follow_probe(runner, channel) -> dict:
    """A rank other than the leader: runtime.profile.ranks.follow_steps, each step's parts timed (the wait in
    recv before it included), every synchronising call counted."""
    from runtime.profile.ranks import follow_steps

    timers = PartTimers()
    install(runner, timers, leader=False)
    rows, run = [], runner.run
    syncs = SyncSites(on=runner.device.type == "cuda")

    def timed_run(inputs, *args, **kwargs):
        start = time.perf_counter()
        try:
            return run(inputs, *args, **kwargs)
        finally:
            end = time.perf_counter()
            rows.append({"rank": 1, "seq": len(rows), "t_start": start, "run_ms": 1e3 * (end - start),
                         "tokens": int(sum(len(ids) for ids in inputs.batch.new_ids)), **timers.ms()})
            timers.reset()

    runner.run = timed_run
    with syncs:
        result = follow_steps(runner, channel)
    out = os.environ.get(OUT_ENV)
    if out:
        Path(out).with_suffix(".rank1.json").write_text(json.dumps({"rows": rows, "syncs": dict(syncs.sites)}, indent=1))
    return result


def summarize(leader: list[dict], follower: list[dict]) -> list[str]:
    """Per (step, regime): medians of the leader's launch parts and of the follower's matching steps."""
    by_seq = {r["seq"]: r for r in follower}
    groups: dict[tuple, list] = collections.defaultdict(list)
    for r in leader:
        if r["regime"] not in ("warm", "ahead"):
            groups[r["step"], r["regime"]].append(r)
    lines = []
    keys = ["launch_ms", "device_ms", "send_ms", "to_device_ms", "plan_ms", "graph_ms", "core_ms",
            "core_store_ms", "core_expand_ms", "core_attend_ms", "sample_ms", "alloc_retries"]
    for (step, regime), rs in groups.items():
        med = {k: statistics.median(r.get(k, 0.0) for r in rs) for k in keys}
        fol = [by_seq[r["seq"]] for r in rs if r["seq"] in by_seq]
        lag = [1e3 * (f["t_start"] - r["t_start"]) for r, f in zip(rs, fol)]
        fmed = {k: statistics.median(f.get(k, 0.0) for f in fol) for k in ("run_ms", "recv_ms", "graph_ms", "core_ms")} if fol else {}
        lines.append(f"{step:13s} {regime:13s} leader " + " ".join(f"{k.removesuffix('_ms')} {v:.2f}" for k, v in med.items())
                     + (f" | follower run {fmed['run_ms']:.2f} recv {fmed['recv_ms']:.2f} graph {fmed['graph_ms']:.2f}"
                        f" core {fmed['core_ms']:.2f} starts {statistics.median(lag):+.2f} ms after the leader" if fol else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    from omegaconf import OmegaConf

    from experiments.compose import compose_config
    from runtime.build import build_core
    from runtime.distributed.app import check_layout, run_job

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tokens", type=int, nargs="*", default=[8192, 2048, 512])
    p.add_argument("--decode-batch", type=int, nargs="*", default=[8])
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    cfg = compose_config(["mode=real", "progress=false"] + args.overrides)
    core = build_core(cfg)
    check_layout(core, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    os.environ[OUT_ENV] = str(args.out)
    job_cfg = {"tp_probe": {"tokens": args.tokens, "decode_batches": args.decode_batch, "context": args.context,
                            "steps": args.steps}}
    OmegaConf.set_struct(cfg, False)
    result = run_job(cfg, core, args.out.parent / "tp_probe_run", (lead_probe, follow_probe), "tp_launch_probe", job_cfg)
    follower_file = args.out.with_suffix(".rank1.json")
    follower = json.loads(follower_file.read_text()) if follower_file.exists() else {"rows": [], "syncs": {}}
    args.out.write_text(json.dumps({"overrides": args.overrides, "leader": result, "follower": follower}, indent=1))
    for line in summarize(result["rows"], follower["rows"]):
        print(line)
    print("leader syncs (one back-to-back launch per step kind):", result["syncs"])
    print("follower syncs (whole run):", follower["syncs"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
