"""Fused MoE at DeepSeek-V3 shapes: ours vs SGLang 0.5.9, the HBM roofline and a torch per-expert loop.

Legend: M = tokens, H = hidden (7168), I = intermediate per shard (2048 / tp), E = experts (256),
K = top-k (8). Scenario: bf16, balanced routing (every expert gets about M*K/E tokens). Per (tp, M):
  1. correctness: the first tokens against fused_moe_ref (bf16 relative error <= 1e-2);
  2. ours: the whole fused_moe call (align, GEMMs, sum) replayed in a CUDA graph, cycling through
     four routings so a call does not find the previous call's experts in L2; printed only: the same
     calls launched eagerly (includes Python/launch overhead) and v1 (unfused SiLU) in a graph;
  3. torch loop: one pass per expert with bf16 matmuls, eager (it syncs once for the counts);
  4. roofline: (distinct experts touched x 3*H*I*2 B + hidden in + out) / 4.24e12 B/s.
CSV columns: tp, M, ours_ms, torch_loop_ms, sglang_ms, roofline_ms, ratio_sglang, ratio_roofline,
ratio_torch (ratios are ours / other: below 1 means ours is faster). Exit status 1 if any check failed.

  python -m kernels.fused_moe.bench --out $OUT/fused_moe.csv
  python -m kernels.fused_moe.bench --quick --out /tmp/fused_moe.csv   # smoke run (CPU: interpreter, fp16)
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import traceback
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():  # CPU smoke run: Triton's interpreter, set before any kernel is defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.fused_moe.config import dtype_name, get_config  # noqa: E402
from kernels.fused_moe.fused_moe_triton import fused_moe  # noqa: E402
from kernels.fused_moe.ref import fused_moe_ref  # noqa: E402
from kernels.fused_moe.synthetic import balanced_topk_ids, random_expert_weights, random_topk_weights  # noqa: E402
from kernels.fused_moe.timing import time_ms  # noqa: E402

HBM_BYTES_PER_S = 4.24e12   # measured device-to-device copy on the H200 here
SGLANG_MS = {               # SGLang 0.5.9 fused_moe, DeepSeek-V3 bf16, H200 (brief from the lead)
    1: {1: 0.223, 8: 1.33, 64: 5.27, 256: 5.41, 1024: 9.48, 4096: 13.1},
    8: {1: 0.072, 8: 0.187, 64: 0.711, 256: 0.742, 1024: 1.17, 4096: 1.94},
}
M_VALUES = (1, 8, 64, 256, 1024, 4096)
NUM_ROUTINGS = 4
CHECK_TOKENS = 4
MAX_REL_ERR = 1e-2
COLUMNS = ("tp", "M", "ours_ms", "torch_loop_ms", "sglang_ms", "roofline_ms", "ratio_sglang",
           "ratio_roofline", "ratio_torch")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class Shape(NamedTuple):
    tp: int
    hidden: int
    inter: int
    experts: int
    top_k: int


FULL_SHAPES = (Shape(1, 7168, 2048, 256, 8), Shape(8, 7168, 256, 256, 8))
QUICK_SHAPES = (Shape(1, 256, 256, 16, 4), Shape(8, 256, 32, 16, 4))


def torch_loop_moe(hidden, w13, w2, topk_weights, topk_ids) -> torch.Tensor:  # [M, H]
    """Naive baseline: one pass per expert that has tokens, matmuls in the weights' dtype."""
    top_k, inter = topk_ids.shape[1], w2.shape[2]
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat)                                          # [S] slots grouped by expert
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()       # the one host sync
    tokens = order // top_k
    weights = topk_weights.reshape(-1)[order].to(hidden.dtype)
    out = torch.zeros_like(hidden)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = slice(start, start + count)
        start += count
        gate_up = hidden[tokens[rows]] @ w13[expert].t()                 # [n, 2I]
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]            # [n, I]
        out.index_add_(0, tokens[rows], (act @ w2[expert].t()) * weights[rows, None])
    return out


def roofline_ms(shape: Shape, topk_ids: torch.Tensor, weight_bytes: int, act_bytes: int) -> float:
    touched = torch.unique(topk_ids).numel()
    weight_total = touched * 3 * shape.hidden * shape.inter * weight_bytes
    activation_total = 2 * topk_ids.shape[0] * shape.hidden * act_bytes          # hidden in, output out
    return (weight_total + activation_total) / HBM_BYTES_PER_S * 1e3


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def bench_case(shape: Shape, num_tokens: int, w13, w2, dtype, args, device) -> dict:
    gen = torch.Generator().manual_seed(1000 * shape.tp + num_tokens)
    hidden = torch.randn(num_tokens, shape.hidden, generator=gen).to(device=device, dtype=dtype)   # [M, H]
    routings = [(random_topk_weights(num_tokens, shape.top_k, generator=gen, device=device),
                 balanced_topk_ids(num_tokens, shape.experts, shape.top_k, generator=gen, device=device))
                for _ in range(NUM_ROUTINGS)]
    topk_weights, topk_ids = routings[0]
    n = min(num_tokens, CHECK_TOKENS)
    out = fused_moe(hidden, w13, w2, topk_weights, topk_ids)
    err = rel_err(out[:n], fused_moe_ref(hidden[:n], w13, w2, topk_weights[:n], topk_ids[:n]))
    ours = time_ms([lambda tw=tw, ids=ids: fused_moe(hidden, w13, w2, tw, ids) for tw, ids in routings],
                   target_ms=10.0)
    eager = _or_nan(lambda: time_ms([lambda tw=tw, ids=ids: fused_moe(hidden, w13, w2, tw, ids)
                                     for tw, ids in routings], use_graph=False, target_ms=10.0))
    unfused = _or_nan(lambda: time_ms([lambda tw=tw, ids=ids: fused_moe(hidden, w13, w2, tw, ids, fuse_silu=False)
                                       for tw, ids in routings], target_ms=10.0))
    loop = math.nan
    if num_tokens <= args.torch_max_m:
        loop = _or_nan(lambda: time_ms([lambda tw=tw, ids=ids: torch_loop_moe(hidden, w13, w2, tw, ids)
                                        for tw, ids in routings], use_graph=False, target_ms=10.0, replays=3))
    sglang = SGLANG_MS.get(shape.tp, {}).get(num_tokens, math.nan) if not args.quick else math.nan
    roof = roofline_ms(shape, topk_ids, w13.element_size(), hidden.element_size())
    cfg = get_config(num_tokens, shape.experts, shape.top_k, shape.inter, dtype_name(w13.dtype))
    return {"tp": shape.tp, "M": num_tokens, "ours_ms": ours, "torch_loop_ms": loop, "sglang_ms": sglang,
            "roofline_ms": roof, "ratio_sglang": ours / sglang, "ratio_roofline": ours / roof,
            "ratio_torch": ours / loop, "_v1_ms": unfused, "_eager_ms": eager, "_rel_err": err,
            "_ok": err <= MAX_REL_ERR, "_cfg": _short_config(cfg)}


def _or_nan(measure) -> float:
    """A secondary measurement that fails (e.g. out of memory) costs its column, not the row."""
    try:
        return measure()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return math.nan


def _short_config(cfg: dict) -> str:
    down = cfg.get("down", {})
    def tile(c: dict) -> str:
        return f"N{c.get('BLOCK_SIZE_N')} K{c.get('BLOCK_SIZE_K')} w{c.get('num_warps')}s{c.get('num_stages')}"
    return f"BM{cfg['BLOCK_SIZE_M']} {tile(cfg)}" + (f" | down {tile(down)}" if down else "")


def print_row(row: dict) -> None:
    def fmt(value, width=8, digits=4):
        if isinstance(value, float) and not math.isnan(value):
            return f"{value:>{width}.{digits}f}"
        return f"{'-':>{width}}"
    status = "ok" if row.get("_ok") else "FAIL"
    print(f"tp={row['tp']:<2} M={row['M']:<5} ours {fmt(row['ours_ms'])} eager {fmt(row.get('_eager_ms', math.nan))} "
          f"v1 {fmt(row.get('_v1_ms', math.nan))} "
          f"torch {fmt(row['torch_loop_ms'])} sglang {fmt(row['sglang_ms'])} roof {fmt(row['roofline_ms'])} | "
          f"/sglang {fmt(row['ratio_sglang'], 5, 2)} /roof {fmt(row['ratio_roofline'], 5, 2)} "
          f"/torch {fmt(row['ratio_torch'], 5, 2)} | err {row.get('_rel_err', math.nan):.1e} {status} "
          f"[{row.get('_cfg', '')}]", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("experiments/results/h200/fused_moe.csv"))
    parser.add_argument("--quick", action="store_true", help="tiny shapes, M in {1, 64}")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--m", type=int, nargs="+", default=None)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default bf16 (fp16 on CPU)")
    parser.add_argument("--torch-max-m", type=int, default=4096, help="skip the torch loop above this M")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = DTYPES[args.dtype or ("bf16" if device == "cuda" else "fp16")]
    m_values = args.m or ((1, 64) if args.quick else M_VALUES)
    shapes = [s for s in (QUICK_SHAPES if args.quick else FULL_SHAPES) if s.tp in args.tp]
    print(f"device {torch.cuda.get_device_name() if device == 'cuda' else 'cpu (Triton interpreter)'}, "
          f"torch {torch.__version__}, triton {__import__('triton').__version__}, {dtype}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows, failed = [], False
    with args.out.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for shape in shapes:
            gen = torch.Generator(device=device).manual_seed(shape.tp)
            w13 = random_expert_weights(shape.experts, 2 * shape.inter, shape.hidden, dtype, generator=gen,
                                        device=device)                                    # [E, 2I, H]
            w2 = random_expert_weights(shape.experts, shape.hidden, shape.inter, dtype, generator=gen,
                                       device=device)                                     # [E, H, I]
            for num_tokens in m_values:
                try:
                    row = bench_case(shape, num_tokens, w13, w2, dtype, args, device)
                except Exception:  # noqa: BLE001 - record the failure, keep benchmarking the rest
                    traceback.print_exc()
                    row = {key: math.nan for key in COLUMNS} | {"tp": shape.tp, "M": num_tokens, "_ok": False}
                failed |= not row["_ok"]
                rows.append(row)
                writer.writerow({key: (f"{value:.6g}" if isinstance(value, float) else value)
                                 for key, value in row.items()})
                file.flush()
                print_row(row)
            del w13, w2
            if device == "cuda":
                torch.cuda.empty_cache()
    print(f"\nfused MoE, {dtype}, balanced routing (ms; ratios = ours / other; eager = no CUDA graph; "
          f"v1 = unfused SiLU) -> {args.out}")
    for row in rows:
        print_row(row)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
