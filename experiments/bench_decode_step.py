"""Decode step time of the real runtime, three ways, against the HBM roofline: (a) torch reference,
eager; (b) fast path (FlashInfer/Triton MLA + Triton fused MoE + Triton fused small ops), eager; (c) fast
path + CUDA graphs. Rows `*_unfused` repeat (b) and (c) with the small ops (norms, rotary, SiLU-and-mul) as
torch code, from a second set of graphs captured that way (skip with --no-unfused).
Dummy weights, context C tokens of KV per sequence, batch sizes B.

Roofline = bytes one step must read / bandwidth: attention, dense-MLP and shared-expert weights, the
expected distinct routed experts of B*top-k uniformly routed tokens (E * (1 - (1 - k/E)^B) per MoE layer),
router, lm_head, B embedding rows, plus the KV cache read (B * C * layers * (kv_lora_rank + rope) * bytes).
`forward` rows time runner.forward (attention plan + graph-input copies + replay or eager forward)
plus the greedy argmax and its host sync, on a prebuilt ForwardBatch; the `execute` row adds the host
work of building the batch from the plan (ForwardBatch.from_plan) and the sampler -- the serving step.

  python experiments/bench_decode_step.py                     # DeepSeek-V2-Lite on one H200, ~3 min
  python experiments/bench_decode_step.py --quick             # tiny model, CPU smoke test (fast path off)
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from hydra.utils import instantiate

from experiments.bench_real_decode import decode_plan
from experiments.compose import compose_config
from experiments.rows_csv import write_rows_csv
from runtime.core.cache.allocator import KVSlotAllocator
from runtime.engine.fast_path import FastPathConfig, torch_reference_small_ops
from runtime.engine.forward_batch import ForwardBatch
from runtime.engine.model_runner import ModelRunner
from runtime.models.moe import MoE

H200_HBM_BYTES_PER_S = 4.24e12


def param_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def expected_distinct_experts(num_experts: int, top_k: int, num_tokens: int) -> float:
    """E[#experts hit] when each token picks top_k distinct experts uniformly at random."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** num_tokens)


def step_bytes(runner: ModelRunner, batch: int, context: int) -> dict[str, float]:
    """Bytes one decode step of `batch` sequences at `context` KV tokens must read from HBM."""
    model = runner.model
    hidden = model.config.hidden_size
    elem = model.lm_head.weight.element_size()
    weights = param_bytes(model.lm_head) + param_bytes(model.model.norm) + batch * hidden * elem
    for layer in model.model.layers:
        weights += param_bytes(layer.self_attn) + param_bytes(layer.input_layernorm)
        weights += param_bytes(layer.post_attention_layernorm)
        mlp = layer.mlp
        if not isinstance(mlp, MoE):
            weights += param_bytes(mlp)
            continue
        experts = mlp.experts
        num_experts, top_k = experts.num_local, model.config.num_experts_per_tok    # routed experts
        per_expert = (experts.w13[0].numel() + experts.w2[0].numel()) * experts.w13.element_size()
        weights += param_bytes(mlp) - param_bytes(experts)          # router + shared experts (when separate)
        weights += mlp.num_fused_shared * per_expert                 # shared experts stacked as experts
        weights += expected_distinct_experts(num_experts, top_k, batch) * per_expert
    kv = batch * context * runner.pool.bytes_per_token()
    return {"weight_bytes": weights, "kv_bytes": kv}


def sync(runner: ModelRunner) -> None:
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)


def time_ms(fn, repeats: int, warmup: int = 2, settle: Callable[[], None] | None = None) -> list[float]:
    """Host ms of each of `repeats` calls of fn after `warmup` untimed ones (then `settle`, e.g. a device
    sync and a barrier across ranks)."""
    for _ in range(warmup):
        fn()
    if settle is not None:
        settle()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return samples


def forward_fn(runner: ModelRunner, fb: ForwardBatch, path: str, unfused: bool = False):
    def step() -> None:
        if unfused:
            with torch_reference_small_ops(runner.model):
                runner.forward(fb, path).argmax(-1).tolist()
        else:
            runner.forward(fb, path).argmax(-1).tolist()    # the host sync a served step ends with
        sync(runner)
    return step


def replay_fn(runner: ModelRunner, graphs, fb: ForwardBatch):
    """What runner.forward(fb) does on a graph hit, through another CudaGraphRunner."""
    def step() -> None:
        graphs.replay(fb, graphs.bucket(fb)).argmax(-1).tolist()
        sync(runner)
    return step


def capture_unfused_graphs(runner: ModelRunner, fast: FastPathConfig, slots: int):
    """Decode graphs of the same model and pool with the small ops as torch code (for comparison)."""
    with torch_reference_small_ops(runner.model):
        return runner._capture(fast, slots)


def bench_batch(runner: ModelRunner, model_name: str, batch: int, context: int, slots: int, vocab: int,
                args: argparse.Namespace, unfused_graphs=None) -> list[dict]:
    plan = decode_plan(batch, context, KVSlotAllocator(slots), vocab)
    fb = ForwardBatch.from_plan(plan, runner.device)
    bytes_ = step_bytes(runner, batch, context)
    roofline_ms = (bytes_["weight_bytes"] + bytes_["kv_bytes"]) / args.bandwidth * 1e3
    fast = runner.attn_backend is not None
    graphs = runner.graphs is not None and runner.graphs.bucket(fb) is not None
    cases = [("reference_eager", forward_fn(runner, fb, "reference"), args.reference_repeats)]
    if fast:
        cases.append(("fast_eager", forward_fn(runner, fb, "eager"), args.repeats))
        if runner.model.small_ops is not None and not args.no_unfused:
            cases.append(("fast_eager_unfused", forward_fn(runner, fb, "eager", unfused=True), args.repeats))
    if graphs:
        cases.append(("fast_graphs", forward_fn(runner, fb, "auto"), args.repeats))
        if unfused_graphs is not None and unfused_graphs.bucket(fb) is not None:
            cases.append(("fast_graphs_unfused", replay_fn(runner, unfused_graphs, fb), args.repeats))
    cases.append(("execute" + ("_graphs" if graphs else "_eager" if fast else "_reference"),
                  lambda: runner.execute(plan), args.repeats))
    rows = []
    for path, fn, repeats in cases:
        samples = time_ms(fn, repeats)
        median = statistics.median(samples)
        rows.append({"model": model_name, "device": str(runner.device), "batch": batch, "context": context,
                     "path": path, "ms_median": round(median, 4), "ms_min": round(min(samples), 4),
                     "roofline_ms": round(roofline_ms, 4), "x_roofline": round(median / roofline_ms, 3),
                     "weight_gb": round(bytes_["weight_bytes"] / 1e9, 3), "kv_gb": round(bytes_["kv_bytes"] / 1e9, 3)})
        print(rows[-1], flush=True)
    return rows


def summarize(rows: list[dict]) -> None:
    """Ratios per batch and the targets: graphs <= 1.3x roofline at B=1 and <= 1.5x at B >= 64;
    graphs >= 2x faster than fast eager at B=1. unfused/graphs: the fused small ops' speedup."""
    print("\nbatch  roofline_ms  graphs_ms  graphs/roofline  eager/graphs  reference/graphs  unfused/graphs"
          "  execute_ms")
    for batch in sorted({r["batch"] for r in rows}):
        by_path = {r["path"]: r for r in rows if r["batch"] == batch}
        graphs = by_path.get("fast_graphs")
        if graphs is None:
            print(f"{batch:5d}  (no graph row)")
            continue
        eager, ref = by_path.get("fast_eager"), by_path.get("reference_eager")
        execute = next((r for p, r in by_path.items() if p.startswith("execute")), None)
        x_roof = graphs["x_roofline"]
        eager_ratio = eager["ms_median"] / graphs["ms_median"] if eager else float("nan")
        unfused = by_path.get("fast_graphs_unfused")
        unfused_ratio = unfused["ms_median"] / graphs["ms_median"] if unfused else float("nan")
        ref_ratio = ref["ms_median"] / graphs["ms_median"] if ref else float("nan")
        targets = []
        if batch == 1:
            targets += [f"roofline<=1.3x {'MET' if x_roof <= 1.3 else 'MISSED'}",
                        f"eager/graphs>=2x {'MET' if eager_ratio >= 2 else 'MISSED'}"]
        if batch >= 64:
            targets.append(f"roofline<=1.5x {'MET' if x_roof <= 1.5 else 'MISSED'}")
        print(f"{batch:5d}  {graphs['roofline_ms']:11.3f}  {graphs['ms_median']:9.3f}  {x_roof:15.2f}  "
              f"{eager_ratio:12.2f}  {ref_ratio:16.2f}  {unfused_ratio:14.2f}  "
              f"{execute['ms_median'] if execute else float('nan'):10.3f}  "
              + "  ".join(targets))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="deepseek_v2_lite")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--reference-repeats", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--bandwidth", type=float, default=H200_HBM_BYTES_PER_S, help="HBM bytes/s")
    parser.add_argument("--no-graphs", action="store_true")
    parser.add_argument("--no-unfused", action="store_true", help="skip the *_unfused comparison rows")
    parser.add_argument("--no-layer-fusions", action="store_true",
                        help="FastPathConfig.layer_fusions=False: shared experts apart, router GEMM, two MLA input GEMMs")
    parser.add_argument("--quick", action="store_true", help="tiny model, small batches: a CPU smoke test")
    parser.add_argument("--out", default=None, help="CSV (default experiments/results/h200/decode_step.csv)")
    args = parser.parse_args()
    if args.quick:
        args.model, args.batch, args.context, args.dtype = "tiny_mla_moe", [1, 4], 32, "float32"
        args.repeats, args.reference_repeats = 3, 2
    out = Path(args.out or ("experiments/results/cpu/decode_step_quick.csv" if args.quick
                            else "experiments/results/h200/decode_step.csv"))
    spec = instantiate(compose_config([f"model={args.model}"]).model)
    slots = max(args.batch) * args.context + 16
    fast = FastPathConfig(cuda_graph=not args.no_graphs, cuda_graph_batch_sizes=tuple(sorted(set(args.batch))),
                          layer_fusions=not args.no_layer_fusions)
    runner = ModelRunner(dict(spec.hf_config), slots, device=args.device, dtype=args.dtype, fast=fast)
    with torch.no_grad():        # random KV (not zeros) so requests' hidden states, and so their routing, differ
        for buf in getattr(runner.pool, "kv_buffers", []) + getattr(runner.pool, "k_buffers", []) \
                + getattr(runner.pool, "v_buffers", []):
            buf.normal_(0.0, 1.0)
    kernel = runner.attn_backend.kernel if runner.attn_backend is not None else "torch reference"
    print(f"{args.model} on {runner.device} ({args.dtype}): load + KV pool of {slots} slots"
          f"{' + graph capture' if runner.graphs else ''} {runner.load_time_s:.1f} s; MLA kernel: {kernel}", flush=True)
    unfused_graphs = None
    if runner.graphs is not None and runner.model.small_ops is not None and not args.no_unfused:
        unfused_graphs = capture_unfused_graphs(runner, fast, slots)
    rows = []
    for batch in args.batch:
        rows += bench_batch(runner, args.model, batch, args.context, slots, spec.vocab_size, args, unfused_graphs)
    summarize(rows)
    write_rows_csv(out, rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
