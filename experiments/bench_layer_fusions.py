"""GPU time of each fast-path layer fusion against what it replaces, per token count, at DeepSeek-V2-Lite's
shapes (H=2048, 64 experts top-6 of I=1408, 2 shared experts, 16 MLA heads): every variant is captured
N times in one CUDA graph and replayed, so the figure is device time per call with launches queued as in
a decode graph.

  python experiments/bench_layer_fusions.py [--tokens 1 4 16 64] [--out CSV]

Rows: router (cast + GEMM + softmax + top-k + gather, vs router_topk's two launches), align (three
launches vs one program), experts (routed fused MoE + the shared MLP's three launches, vs one fused MoE
over the stacked experts), MLA input (two GEMMs vs one over the stacked weight).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from experiments.rows_csv import write_rows_csv
from kernels.fused_moe.align import moe_align_block_size
from kernels.fused_moe.fused_moe_triton import fused_moe
from kernels.fused_moe.router_topk import router_topk
from kernels.small_ops.triton_act import silu_and_mul_triton
from runtime.models.moe import append_shared_pairs, select_experts

H, E, K, I, S, Q_ROWS, KV_ROWS = 2048, 64, 6, 1408, 2, 16 * 192, 576


def graph_ms(fn, calls: int = 20, replays: int = 10) -> float:
    """Device ms per call of fn, captured `calls` times in one graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (calls * replays)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--out", default="experiments/results/h200/layer_fusions.csv")
    args = parser.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)

    def randn(*shape, scale=0.02):
        return (torch.randn(*shape, generator=gen, device=dev) * scale).to(dt)

    router = randn(E, H)
    router_f32 = router.float()
    w13, w2 = randn(E + S, 2 * I, H), randn(E + S, H, I)
    shared_gate_up, shared_down = randn(2 * S * I, H), randn(H, S * I)
    w_q, w_kv = randn(Q_ROWS, H), randn(KV_ROWS, H)
    w_stacked = torch.cat([w_q, w_kv])
    rows = []
    for tokens in args.tokens:
        x = randn(tokens, H, scale=1.0)
        weights, ids = select_experts(x.float() @ router_f32.t(), K)
        weights8, ids8 = append_shared_pairs(weights, ids, E, S)

        def router_old():
            return select_experts(x.float() @ router_f32.t(), K)

        def experts_separate():
            out = fused_moe(x, w13[:E], w2[:E], weights, ids)
            act = silu_and_mul_triton(F.linear(x, shared_gate_up))
            return out.addmm_(act, shared_down.t())

        variants = {
            ("router", "router GEMM + softmax + top-k"): router_old,
            ("router", "router_topk (2 launches, + shared pairs)"): lambda: router_topk(x, router, E, K, num_shared=S),
            ("align", "three launches"): lambda: moe_align_block_size(ids8, 16, E + S, one_program_max_elements=0),
            ("align", "one program"): lambda: moe_align_block_size(ids8, 16, E + S),
            ("experts", "routed fused MoE + shared MLP"): experts_separate,
            ("experts", "stacked shared experts"): lambda: fused_moe(x, w13, w2, weights8, ids8, config_shape=(E, K)),
            ("mla_input", "q_proj + kv_a_proj"): lambda: (F.linear(x, w_q), F.linear(x, w_kv)),
            ("mla_input", "one stacked GEMM"): lambda: F.linear(x, w_stacked),
        }
        for (part, variant), fn in variants.items():
            ms = graph_ms(fn)
            rows.append({"tokens": tokens, "part": part, "variant": variant, "us_per_call": round(ms * 1e3, 2)})
            print(rows[-1], flush=True)
    print(f"\n{'part':10s} {'variant':42s} " + " ".join(f"T={t:<5d}" for t in args.tokens))
    for part, variant in dict.fromkeys((r["part"], r["variant"]) for r in rows):
        us = [r["us_per_call"] for r in rows if (r["part"], r["variant"]) == (part, variant)]
        print(f"{part:10s} {variant:42s} " + " ".join(f"{u:7.2f}" for u in us))
    write_rows_csv(args.out, rows)


if __name__ == "__main__":
    main()
