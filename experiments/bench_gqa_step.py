"""Step times of the MHA/GQA model families (Llama-3-8B, Qwen2-MoE) in the real runtime, before and after the
GQA fast path, against the HBM roofline (decode) and the matmul roofline (prefill). Dummy weights.

Paths, each timed as runner.forward + greedy argmax + its host sync on a prebuilt ForwardBatch:
  torch_attention_eager  the fused MoE and fused small ops with the torch reference attention -- what
                         `mode=real` ran for these families before FastGQABackend
  fast_eager             FastGQABackend (FlashInfer paged prefill/decode) + fused MoE + fused small ops
  fast_graphs            the same decode step captured once in a CUDA graph through make_graph_backend
                         (what the CUDA-graph runner replays), with the per-step plan and input copies
Decode roofline = bytes one step must read (weights, expected distinct experts, KV) / HBM bandwidth
(experiments/bench_decode_step.step_bytes); prefill roofline = 2 * active params * T + causal attention FLOPs
over the measured bf16 matmul rate.

  python experiments/bench_gqa_step.py --model llama3_8b        # one H200, ~1 min
  python experiments/bench_gqa_step.py --model qwen2_moe --batch 1 8 64
"""
from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

import torch
from hydra.utils import instantiate

from experiments.bench_decode_step import H200_HBM_BYTES_PER_S, param_bytes, step_bytes, time_ms
from experiments.bench_real_decode import decode_plan
from experiments.compose import compose_config
from runtime.core.cache.allocator import KVSlotAllocator
from runtime.engine.cuda_graph_runner import DecodeGraphInputs
from runtime.engine.fast_path import FastPathConfig
from runtime.engine.forward_batch import ForwardBatch
from runtime.engine.gqa_backend import make_graph_backend
from runtime.engine.model_runner import ModelRunner
from runtime.models.moe import MoE

MATMUL_FLOP_S = 7.8e14        # measured 8192^3 bf16 matmul on the H200


class OneGraph:
    """One decode forward of `bs` rows captured in a CUDA graph (what the CUDA-graph runner does per size)."""

    def __init__(self, runner: ModelRunner, bs: int, max_kv_tokens: int, dummy_slot: int) -> None:
        self.runner, self.bs = runner, bs
        device = runner.device
        self.inputs = DecodeGraphInputs(bs, max_kv_tokens, dummy_slot, device)
        self.backend = make_graph_backend(runner.model, runner.dtype, device, bs, max_kv_tokens,
                                          kernel=runner.attn_backend.kernel)
        self.fb = self.inputs.forward_batch(bs)
        self.fb.attn_backend = self.backend
        self.logits = torch.zeros(bs, runner.model.config.vocab_size, dtype=torch.float32, device=device)
        self._plan(self.inputs.fill_dummy(bs))
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._run()
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=stream):
            self._run()

    def _run(self) -> None:
        self.logits.copy_(self.runner.model(self.fb, self.runner.pool))

    def _plan(self, kv_indptr: list[int]) -> None:
        if self.backend.flashinfer is not None:
            lens = [b - a for a, b in zip(kv_indptr, kv_indptr[1:])]
            self.backend.plan_flashinfer(torch.arange(self.bs + 1, dtype=torch.int32),
                                         torch.tensor(kv_indptr, dtype=torch.int32),
                                         self.inputs.kv_indices[:kv_indptr[-1]],
                                         torch.tensor(lens, dtype=torch.int32), causal=False)

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        self._plan(self.inputs.fill(fb, self.bs))
        self.graph.replay()
        return self.logits[:fb.batch_size]


def prefill_flops(runner: ModelRunner, num_tokens: int) -> float:
    """2 * active params * T (routed experts: top-k of E; no embedding, and the LM head runs on one row)
    + causal attention 4 * N * D * T^2 / 2 per layer."""
    model, cfg = runner.model, runner.model.config
    active = 0.0
    for name, p in model.named_parameters():
        if "embed_tokens" in name or "lm_head" in name:
            continue
        active += p.numel()
    for moe in (m for m in model.modules() if isinstance(m, MoE)):
        routed = moe.experts.w13.numel() + moe.experts.w2.numel()
        active -= routed * (1 - cfg.num_experts_per_tok / moe.experts.w13.shape[0])
    attention = cfg.num_hidden_layers * 4 * cfg.num_attention_heads * cfg.head_dim * num_tokens * num_tokens / 2
    return 2 * active * num_tokens + attention


def timed_row(fn, repeats: int, **fields) -> dict:
    samples = time_ms(fn, repeats, warmup=1)
    median = statistics.median(samples)
    row = {**fields, "ms_median": round(median, 3), "ms_min": round(min(samples), 3)}
    row["x_roofline"] = round(median / row["roofline_ms"], 3) if row["roofline_ms"] else float("nan")
    print(row, flush=True)
    return row


def forward_fn(runner: ModelRunner, fb: ForwardBatch, path: str):
    def step() -> None:
        if path == "torch_attention_eager":
            fb.attn_backend = None                                   # fused MoE + small ops, torch attention
            runner.model(fb, runner.pool).argmax(-1).tolist()
        else:
            runner.forward(fb, "eager").argmax(-1).tolist()
        torch.cuda.synchronize(runner.device)
    return step


def bench_decode(runner, model_name, batch, context, slots, vocab, args) -> list[dict]:
    fb = ForwardBatch.from_plan(decode_plan(batch, context, KVSlotAllocator(slots), vocab), runner.device)
    b = step_bytes(runner, batch, context)
    common = dict(model=model_name, kind="decode", batch=batch, tokens=batch, context=context,
                  roofline_ms=round((b["weight_bytes"] + b["kv_bytes"]) / args.bandwidth * 1e3, 5))
    rows = [timed_row(forward_fn(runner, fb, "torch_attention_eager"), args.reference_repeats,
                      path="torch_attention_eager", **common),
            timed_row(forward_fn(runner, fb, "fast_eager"), args.repeats, path="fast_eager", **common)]
    graph = OneGraph(runner, batch, batch * context + batch, dummy_slot=slots)
    eager = runner.forward(fb, "eager").clone()
    replayed = graph.replay(fb)
    err = ((replayed - eager).norm() / eager.norm()).item()

    def replay_step() -> None:
        graph.replay(fb).argmax(-1).tolist()
        torch.cuda.synchronize(runner.device)
    rows.append(timed_row(replay_step, args.repeats, path="fast_graphs", **common))
    rows[-1]["graph_vs_eager_rel_err"] = f"{err:.1e}"
    del graph
    torch.cuda.empty_cache()
    return rows


def bench_prefill(runner, model_name, num_tokens, vocab, args) -> list[dict]:
    ids = [(13 * i + 5) % vocab for i in range(num_tokens)]
    fb = ForwardBatch.build([(ids, 0, list(range(num_tokens)))], runner.device)
    common = dict(model=model_name, kind="prefill", batch=1, tokens=num_tokens, context=num_tokens,
                  roofline_ms=round(prefill_flops(runner, num_tokens) / MATMUL_FLOP_S * 1e3, 5))
    rows = []
    if num_tokens <= args.max_reference_prefill:    # the torch attention holds a [N, T, T] fp32 score matrix
        rows.append(timed_row(forward_fn(runner, fb, "torch_attention_eager"), args.reference_repeats,
                              path="torch_attention_eager", **common))
    rows.append(timed_row(forward_fn(runner, fb, "fast_eager"), args.repeats, path="fast_eager", **common))
    return rows


def summarize(rows: list[dict]) -> None:
    print(f"\n{'model':<10} {'kind':<8} {'B':>4} {'T':>5} {'ctx':>6} {'roofline':>9} {'torch attn':>11} "
          f"{'fast eager':>11} {'graphs':>9} {'graphs/roof':>11} {'before/after':>12}")
    keys = sorted({(r["model"], r["kind"], r["batch"], r["tokens"], r["context"]) for r in rows})
    for key in keys:
        by = {r["path"]: r for r in rows if (r["model"], r["kind"], r["batch"], r["tokens"], r["context"]) == key}
        ms = {p: by[p]["ms_median"] if p in by else float("nan") for p in
              ("torch_attention_eager", "fast_eager", "fast_graphs")}
        best = min(v for v in (ms["fast_eager"], ms["fast_graphs"]) if v == v)
        roof = next(iter(by.values()))["roofline_ms"] or float("nan")
        print(f"{key[0]:<10} {key[1]:<8} {key[2]:>4} {key[3]:>5} {key[4]:>6} {roof:>9.3f} "
              f"{ms['torch_attention_eager']:>11.2f} {ms['fast_eager']:>11.2f} {ms['fast_graphs']:>9.2f} "
              f"{ms['fast_graphs'] / roof:>11.2f} {ms['torch_attention_eager'] / best:>12.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama3_8b")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--prefill", type=int, nargs="*", default=[512, 2048, 8192])
    parser.add_argument("--max-reference-prefill", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--reference-repeats", type=int, default=2)
    parser.add_argument("--bandwidth", type=float, default=H200_HBM_BYTES_PER_S, help="HBM bytes/s")
    parser.add_argument("--out", default=None, help="CSV (default experiments/results/h200/gqa_step_<model>.csv)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench needs a CUDA GPU")
    out = Path(args.out or f"experiments/results/h200/gqa_step_{args.model}.csv")
    spec = instantiate(compose_config([f"model={args.model}"]).model)
    slots = max(max(args.batch) * args.context, max(args.prefill, default=0)) + 16
    runner = ModelRunner(dict(spec.hf_config), slots + 1, device="cuda", dtype="bfloat16",   # + a dummy slot
                         fast=FastPathConfig(cuda_graph=False, progress=False))
    with torch.no_grad():       # random KV, so requests' hidden states (and their routing) differ
        for buf in runner.pool.k_buffers + runner.pool.v_buffers:
            buf.normal_(0.0, 1.0)
    print(f"{args.model}: {param_bytes(runner.model) / 1e9:.1f} GB weights, KV pool {slots} slots, attention "
          f"kernel {runner.attn_backend.kernel}, load {runner.load_time_s:.1f} s", flush=True)
    rows = []
    for num_tokens in args.prefill:
        rows += bench_prefill(runner, args.model, num_tokens, spec.vocab_size, args)
    for batch in args.batch:
        rows += bench_decode(runner, args.model, batch, args.context, slots, spec.vocab_size, args)
    summarize(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
