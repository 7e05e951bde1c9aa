"""Tensor and expert parallelism on one node, against one GPU: decode step time per layout, and the
greedy tokens each layout serves.

  python experiments/bench_parallel.py speed  --layouts tp1 tp2 tp2ep2 --batch 64 256     # bf16, CUDA graphs
  python experiments/bench_parallel.py tokens --layouts tp1 tp2 tp2ep2 --dtype float32    # 8 x 64 greedy tokens
  python experiments/bench_parallel.py speed --model tiny_mla_moe --device cpu --batch 4 --context 64   # CPU smoke
  python experiments/bench_parallel.py speed --model deepseek_v3 --layouts tp4 --batch 1 64 \
      --override model.hf_config.num_hidden_layers=5 model.weight_dtype=bfloat16   # full width, 3 dense + 2 MoE layers

speed: every rank builds the runner (dummy weights, decode graphs at the benchmarked batch sizes) and
times (a) `forward` (graph replay + the greedy argmax's host sync; all ranks step in lockstep), and
(b) the served step: the leader's `launch(plan).wait()` with each step's inputs broadcast to the group,
the other ranks running what they receive (runtime.distributed.worker.follow), and (c) the same served steps
pipelined as the overlap loop launches them (step n + 1 before waiting for step n; each step's device interval,
`served_pipelined`). Context C tokens of KV per
sequence. Rows: the slowest rank's median, and the largest peak of allocated GPU memory of any rank (dummy
weight init included). `--override` applies Hydra overrides to the composed model config (each row records
them); the runner's weights are in --dtype whatever model.weight_dtype says (the runtime has no fp8 linears).
tokens: `runtime.distributed.app.serve` (the mode=real path: scheduler on the leader, plan broadcast, graphs)
serves 8 greedy requests of 64 new tokens; every layout's tokens are compared with tp1's (fp32: they must all
match; bf16: reported, see --dtype).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LAYOUTS = {"tp1": (1, 1), "tp2": (2, 1), "tp2ep2": (2, 2), "tp4": (4, 1), "tp4ep4": (4, 4)}
# tokens only: DP attention over the tp ranks (each its own requests and KV; MoE across all of them)
DP_ATTENTION_LAYOUTS = {"tp2dpa": 2, "tp4dpa": 4}


def parse_layout(name: str) -> tuple[int, int]:
    if name not in LAYOUTS:
        raise SystemExit(f"layout {name!r}: expected one of {sorted(LAYOUTS)}")
    return LAYOUTS[name]


# -- speed ------------------------------------------------------------------------------------
def layout_rank(info, groups, args: dict) -> dict:
    import torch
    import torch.distributed as dist
    from hydra.utils import instantiate

    from experiments.bench_decode_step import time_ms
    from experiments.bench_real_decode import decode_plan
    from experiments.compose import compose_config
    from runtime.core.cache.allocator import KVSlotAllocator
    from runtime.distributed.sharding import SINGLE, ModelParallel
    from runtime.distributed.step_channel import STOP, StepChannel
    from runtime.distributed.worker import follow
    from runtime.engine.fast_path import FastPathConfig
    from runtime.engine.forward_batch import ForwardBatch
    from runtime.engine.model_runner import ModelRunner
    from runtime.profile.timing import time_plan

    spec = instantiate(compose_config([f"model={args['model']}", *args["overrides"]]).model)
    parallel = ModelParallel(info.tp_rank, info.tp, info.ep, groups.comm()) if groups else SINGLE
    batches, context = args["batch"], args["context"]
    slots = max(batches) * context + 16
    fast = FastPathConfig(cuda_graph=not args["no_graphs"], cuda_graph_batch_sizes=tuple(batches), progress=False,
                          mla_kernel=args["mla_kernel"])
    runner = ModelRunner(dict(spec.hf_config), slots, device=info.device, dtype=args["dtype"], fast=fast,
                         parallel=parallel)
    cuda = runner.device.type == "cuda"
    channel = StepChannel(groups.cpu_group, info.leader_rank) if groups else None

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(runner.device)

    def barrier() -> None:
        if groups:
            dist.barrier(group=groups.cpu_group)

    def timed(fn, repeats: int, together: bool = True) -> list[float]:
        def settle() -> None:
            sync()
            if together:
                barrier()
        return time_ms(fn, repeats, warmup=3, settle=settle)

    tokens = greedy_tokens(runner, spec.vocab_size, args) if args.get("tokens") else None
    rows = []
    for batch in batches:
        plan = decode_plan(batch, context, KVSlotAllocator(slots), spec.vocab_size)
        fb = ForwardBatch.from_plan(plan, runner.device)
        graphs = runner.graphs is not None and runner.graphs.bucket(fb) is not None
        for path in (["auto"] if graphs else []) + ["eager"]:
            samples = timed(lambda: runner.forward(fb, path).argmax(-1).tolist(), args["repeats"])
            rows.append(_row(args, info, batch, "forward_graphs" if path == "auto" else "forward_eager", samples,
                             runner.load_time_s))
        barrier()
        if info.is_leader:          # the served step: prepare, broadcast, run, tokens to the host
            if channel is not None:
                runner.step_sender = channel.send
            samples = timed(lambda: runner.launch(plan).wait(), args["repeats"], together=False)   # peers follow
            sent = channel.bytes_sent if channel else 0
            # as the overlap loop serves: step n + 1 launched before step n is waited for; its device interval
            pipelined = time_plan(runner, plan, args["repeats"]).durations_s
            runner.step_sender = None
            if channel is not None:
                channel.send(STOP)
            rows.append(_row(args, info, batch, "served_step", samples, runner.load_time_s, sent))
            rows.append(_row(args, info, batch, "served_pipelined", [1e3 * d for d in pipelined], runner.load_time_s))
        else:
            follow(runner, channel)
            for path in ("served_step", "served_pipelined"):
                rows.append(_row(args, info, batch, path, [float("nan")], runner.load_time_s))
        barrier()
    peak_gb = round(torch.cuda.max_memory_allocated(runner.device) / 1e9, 2) if cuda else float("nan")
    return {"rows": [dict(r, peak_memory_gb=peak_gb) for r in rows], "tokens": tokens}


def greedy_tokens(runner, vocab: int, args: dict) -> dict:
    """Prefill `requests` prompts of `prompt_len` tokens, then `steps` greedy decodes at that batch (a
    captured graph when there is one): free-running, and teacher-forced on `forced` (the reference
    layout's tokens) when given. Returns tokens [steps + 1, B], the top-2 logit gap of every position,
    and the prefill logits [B, V]."""
    import torch

    from runtime.engine.forward_batch import ForwardBatch

    gen = torch.Generator().manual_seed(0)
    num, length, steps = args["requests"], args["prompt_len"], args["steps"]
    prompts = torch.randint(0, vocab, (num, length), generator=gen).tolist()
    stride = length + steps + 1

    def run(forced):
        slots = [list(range(i * stride, i * stride + length)) for i in range(num)]
        logits = runner.forward(ForwardBatch.build([(prompts[i], 0, slots[i]) for i in range(num)], runner.device))
        first = logits.float().cpu()
        tokens, gaps = [], []
        for step in range(steps + 1):
            top2 = logits.float().topk(2, dim=-1)
            tokens.append(top2.indices[:, 0].tolist())
            gaps.append((top2.values[:, 0] - top2.values[:, 1]).tolist())
            if step == steps:
                break
            feed = forced[step] if forced is not None else tokens[-1]
            batch = []
            for i in range(num):
                slots[i].append(slots[i][-1] + 1)
                batch.append(([feed[i]], len(slots[i]) - 1, slots[i]))
            logits = runner.forward(ForwardBatch.build(batch, runner.device))
        return tokens, gaps, first

    free, free_gaps, first = run(None)
    out = {"free": free, "gaps": free_gaps, "prefill_logits": first}
    if args.get("forced") is not None:
        out["forced"], out["forced_gaps"], _ = run(args["forced"])
    return out


def compare_tokens(reference: dict, got: dict) -> dict:
    """Free-running: first divergence per request. Teacher-forced (fed the reference's tokens): positions
    whose greedy choice differs, and the reference's top-2 gap at each (a near-tie flips under rounding)."""
    import numpy as np

    ref, gaps = np.array(reference["free"]), np.array(reference["gaps"])        # [S + 1, B]
    free = np.array(got["free"])
    first_div = [int(np.argmax(free[:, b] != ref[:, b])) if (free[:, b] != ref[:, b]).any() else None
                 for b in range(ref.shape[1])]
    forced = np.array(got.get("forced", got["free"]))
    diff = forced != ref
    logit_err = float(np.abs(np.asarray(got["prefill_logits"]) - np.asarray(reference["prefill_logits"])).max())
    return {"positions": int(ref.size), "free_running_equal": int((free == ref).sum()),
            "free_running_first_divergence": first_div, "teacher_forced_equal": int((~diff).sum()),
            "teacher_forced_mismatch_ref_gaps": [round(float(g), 4) for g in gaps[diff]],
            "prefill_logits_max_abs_diff": round(logit_err, 5),
            "ref_min_gap": round(float(gaps.min()), 5)}


def _row(args: dict, info, batch: int, path: str, samples: list[float], load_s: float, sent: int = 0) -> dict:
    return {"model": args["model"], "model_overrides": " ".join(args["overrides"]), "layout": args["layout"],
            "tp": info.tp, "ep": info.ep, "rank": info.rank,
            "dtype": args["dtype"], "batch": batch, "context": args["context"], "path": path,
            "ms_median": round(statistics.median(samples), 4), "ms_min": round(min(samples), 4),
            "load_s": round(load_s, 2), "broadcast_bytes": sent}


def run_speed(args: argparse.Namespace) -> tuple[list[dict], dict]:
    """Every layout in turn (tokens against the first layout's, then decode timing); the CSV and the token
    report are rewritten after each layout, so a run cut short keeps what it measured."""
    from runtime.distributed.spawn import run_on_ranks

    rows, reference, report = [], None, {}
    for name in args.layouts:
        tp, ep = parse_layout(name)
        params = dict(model=args.model, overrides=args.override, layout=name, batch=args.batch, context=args.context,
                      dtype=args.dtype, repeats=args.repeats, no_graphs=args.no_graphs, mla_kernel=args.mla_kernel,
                      tokens=args.tokens, requests=args.requests, steps=args.steps, prompt_len=args.prompt_len,
                      forced=reference["free"] if reference is not None else None)
        started = time.perf_counter()
        try:
            per_rank = run_on_ranks(layout_rank, tp, params, ep=ep, device=args.device, timeout_s=args.timeout_s)
        except RuntimeError as err:
            if args.mla_kernel != "auto":
                raise
            print(f"{name}: {str(err).splitlines()[0]} -- retrying with the Triton MLA kernels", flush=True)
            params["mla_kernel"] = "triton"
            per_rank = run_on_ranks(layout_rank, tp, params, ep=ep, device=args.device, timeout_s=args.timeout_s)
        wall = round(time.perf_counter() - started, 1)
        for i, row in enumerate(per_rank[0]["rows"]):       # the slowest rank's median
            medians = [r["rows"][i]["ms_median"] for r in per_rank if r["rows"][i]["ms_median"] == r["rows"][i]["ms_median"]]
            peak_gb = max(r["rows"][i]["peak_memory_gb"] for r in per_rank)
            rows.append(dict(row, ms_median=max(medians), wall_s=wall, mla_kernel=params["mla_kernel"],
                             peak_memory_gb=peak_gb))
            print(json.dumps(rows[-1]), flush=True)
        tokens = per_rank[0]["tokens"]
        if tokens is not None:
            if reference is None:
                reference = tokens
            report[name] = compare_tokens(reference, tokens)
            print(name, json.dumps(report[name])[:600], flush=True)
        write_results(args, rows, report)
    return rows, report


def write_results(args: argparse.Namespace, rows: list[dict], report: dict) -> None:
    base = {(r["batch"], r["path"]): r["ms_median"] for r in rows if r["layout"] == args.layouts[0]}
    for r in rows:
        r["speedup_vs_" + args.layouts[0]] = round(base.get((r["batch"], r["path"]), float("nan")) / r["ms_median"], 3)
    from experiments.rows_csv import write_rows_csv

    path = write_rows_csv(args.out / f"parallel_decode_{args.model}.csv", rows)
    if report:
        meta = {"model": args.model, "dtype": args.dtype, "requests": args.requests, "steps": args.steps,
                "prompt_len": args.prompt_len, "reference": args.layouts[0], "layouts": report}
        (args.out / f"parallel_greedy_{args.model}_{args.dtype}.json").write_text(json.dumps(meta, indent=2) + "\n")


# -- tokens -----------------------------------------------------------------------------------
def token_config(args: argparse.Namespace, name: str):
    from experiments.compose import compose_config

    if name in DP_ATTENTION_LAYOUTS:
        layout = [f"tp={DP_ATTENTION_LAYOUTS[name]}", f"dp={DP_ATTENTION_LAYOUTS[name]}", "dp_attention=true"]
    else:
        tp, ep = parse_layout(name)
        layout = [f"tp={tp}", f"ep={ep}"]
    return compose_config([
        "mode=real", f"model={args.model}", *getattr(args, "override", ()), *layout, f"real.dtype={args.dtype}",
        f"real.device={args.device}", "real.warmup=false", f"real.cuda_graph_max_bs={args.requests}",
        "real.as_fast_as_possible=true", f"kv.capacity_tokens={args.requests * (args.prompt_len + args.steps) * 2}",
        "progress=false", "print_summary=false"])


def token_specs(args: argparse.Namespace, vocab: int) -> list:
    import random

    from runtime.core.request import RequestSpec, SamplingParams

    rng = random.Random(0)
    return [RequestSpec(f"r{i}", 0.0, tuple(rng.randrange(vocab) for _ in range(args.prompt_len)), args.steps,
                        sampling=SamplingParams(max_new_tokens=args.steps, ignore_eos=True, temperature=0.0))
            for i in range(args.requests)]


def run_tokens(args: argparse.Namespace, out_dir: Path) -> dict:
    import tempfile

    from hydra.utils import instantiate

    from runtime.distributed.app import serve

    outputs, replays = {}, {}
    for name in args.layouts:
        cfg = token_config(args, name)
        specs = token_specs(args, instantiate(cfg.model).vocab_size)
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            results, _, _ = serve(cfg, tmp, collect_output_ids=True, specs=specs)
        # one leader, or (DP attention) one per attention rank, each with the requests routed to it
        outputs[name] = {rid: ids for result in results.values() for rid, ids in result.output_ids.items()}
        replays[name] = [(results[r].facts.get("graph_replays", 0), results[r].facts.get("piecewise_replays", 0))
                         for r in sorted(results)]                                            # per leader
        print(f"{name}: served {len(specs)} x {args.steps} tokens in {time.perf_counter() - started:.1f} s", flush=True)
    reference = outputs[args.layouts[0]]
    report = {"model": args.model, "dtype": args.dtype, "requests": args.requests, "steps": args.steps,
              "prompt_len": args.prompt_len, "reference": args.layouts[0], "layouts": {}}
    for name, got in outputs.items():
        first_diff = [next((i for i, (a, b) in enumerate(zip(reference[rid], got[rid])) if a != b), None)
                      for rid in sorted(reference)]
        report["layouts"][name] = {
            "tokens_equal": sum(a == b for rid in reference for a, b in zip(reference[rid], got[rid])),
            "tokens": sum(len(v) for v in reference.values()),
            "first_divergence_per_request": first_diff,
            "graph_replays_per_leader": [d for d, _ in replays[name]],        # decode steps replayed as a graph
            "piecewise_replays_per_leader": [p for _, p in replays[name]]}    # extend steps replayed as pieces
        print(name, report["layouts"][name], flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("speed", "tokens"))
    p.add_argument("--model", default="deepseek_v2_lite")
    p.add_argument("--override", nargs="+", default=[], help="Hydra overrides of the model config, e.g. "
                   "model.hf_config.num_hidden_layers=5 model.weight_dtype=bfloat16")
    p.add_argument("--layouts", nargs="+", default=["tp1", "tp2", "tp2ep2"])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dtype", default=None, help="bfloat16 (speed default) or float32 (tokens default)")
    p.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--timeout-s", type=float, default=600.0)
    p.add_argument("--no-graphs", action="store_true", help="speed: eager decode only")
    p.add_argument("--mla-kernel", default="auto", choices=("auto", "flashinfer", "triton"))
    p.add_argument("--tokens", action="store_true", help="speed: first compare greedy tokens (runner level, "
                   "the speed dtype) with the first layout's, free-running and teacher-forced")
    p.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "h200")
    args = p.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.what == "speed" else "float32")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.what == "speed":
        _, report = run_speed(args)
        print(f"wrote {args.out}/parallel_decode_{args.model}.csv" + (" and the greedy-token report" if report else ""))
        return 0
    report = run_tokens(args, args.out)
    path = args.out / f"parallel_tokens_{args.model}_{args.dtype}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    mismatched = {n: r for n, r in report["layouts"].items() if r["tokens_equal"] != r["tokens"]}
    return 1 if mismatched and args.dtype == "float32" else 0


if __name__ == "__main__":
    sys.exit(main())
