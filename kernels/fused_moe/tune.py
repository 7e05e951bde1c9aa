"""Tune the fused MoE launch configs on the GPU and write SGLang-style tables to configs/.

Legend: M = tokens, E = experts, K = top-k, H = hidden, I = intermediate size per shard (N in file
names), BM/BN/BK = block sizes. For every M the BM candidates follow M*K/E; for each BM the gate_up
kernel (gated epilogue) and the down kernel are timed separately over a pruned tile grid (CUDA-graph
replay, balanced routing), and the BM whose two best tiles sum to the least time wins:
  {"BLOCK_SIZE_M": .., <gate_up tile keys>, "down": {<down tile keys>}}
A deadline (--budget-s, shared by all shapes) keeps the run bounded: M values are visited spread out
(1, 4096, 64, ...) so that an interrupted table still covers the range; missing M fall back to the
nearest tuned one. Compiled kernels land in Triton's disk cache, so bench.py reuses them.

  python -m kernels.fused_moe.tune --experts 256 --hidden 7168 --top-k 8 --inter 2048 256
  python -m kernels.fused_moe.tune --quick --out-dir /tmp/cfg    # CPU interpreter smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from tqdm import tqdm

if not torch.cuda.is_available():  # CPU smoke run: Triton's interpreter, set before any kernel is defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.fused_moe.align import moe_align_block_size
from kernels.fused_moe.config import (
    CONFIG_DIR, TILE_KEYS, config_file_name, default_config, device_name, fit_config, split_config,
)
from kernels.fused_moe.gemm import invoke_moe_gemm
from kernels.fused_moe.quant import FP8_DTYPE
from kernels.fused_moe.synthetic import balanced_topk_ids, random_expert_weights, random_topk_weights
from kernels.fused_moe.timing import time_ms

M_VALUES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
VISIT_ORDER = (1, 8192, 64, 512, 4096, 8, 2048, 256, 16, 1024, 128, 2, 32, 4)   # spread out, then fill in
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8_w8a8": FP8_DTYPE}


def block_m_candidates(num_tokens: int, num_experts: int, top_k: int) -> tuple[int, ...]:
    tokens_per_expert = num_tokens * top_k / num_experts
    if tokens_per_expert <= 12:
        return (16,)
    if tokens_per_expert <= 24:
        return (16, 32)
    if tokens_per_expert <= 48:
        return (32, 64)
    return (64, 128)


def tile_candidates(block_m: int, gated: bool, use_fp8: bool, act_bytes: int) -> list[dict]:
    """~8-12 tiles per BM, after dropping those whose pipeline buffers do not fit shared memory."""
    if block_m <= 32:   # weight streaming: enough bytes in flight, enough CTAs along N (gated N = I is short)
        widths = (16, 32, 64) if gated else (32, 64, 128)
        grid = [(bn, bk, 4, stages) for bn in widths for bk in (128, 256) for stages in (3, 4)]
        group = 1
    else:               # compute: big tiles, L2 reuse of weight tiles across row blocks
        grid = [(bn, bk, warps, stages) for bn in (64, 128) for bk in (64, 128)
                for warps, stages in ((4, 3), (8, 3), (8, 4))]
        group = 8
    tiles, seen = [], set()
    w_bytes = 1 if use_fp8 else act_bytes
    for bn, bk, warps, stages in grid:
        if (2 if gated else 1) * block_m * bn > 128 * 32 * warps:   # >128 fp32 accumulators a thread: spills
            continue
        cfg = {"BLOCK_SIZE_M": block_m, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": group,
               "num_warps": warps, "num_stages": stages}
        fitted = fit_config(cfg, 1 if use_fp8 else act_bytes, w_bytes, gated, use_fp8)
        key = tuple(sorted(fitted.items()))
        if fitted == cfg and key not in seen:   # a tile the kernel would clamp is someone else's tile
            seen.add(key)
            tiles.append(cfg)
    return tiles


class Problem:
    """Weights of one (E, H, I, dtype) shape and the inputs of one M, on the device."""

    def __init__(self, args: argparse.Namespace, inter: int, device: str):
        self.args, self.inter, self.device = args, inter, device
        self.dtype = DTYPES[args.dtype]
        self.use_fp8 = args.dtype == "fp8_w8a8"
        self.act_dtype = torch.bfloat16 if self.use_fp8 else self.dtype
        gen = torch.Generator(device=device).manual_seed(0)
        e, h = args.experts, args.hidden
        self.w13 = random_expert_weights(e, 2 * inter, h, self.dtype, generator=gen, device=device)  # [E, 2I, H]
        self.w2 = random_expert_weights(e, h, inter, self.dtype, generator=gen, device=device)       # [E, H, I]
        if self.use_fp8:
            self.w13_scale = torch.rand(e, -(-2 * inter // 128), -(-h // 128), device=device) * 1e-3
            self.w2_scale = torch.rand(e, -(-h // 128), -(-inter // 128), device=device) * 1e-3
        else:
            self.w13_scale = self.w2_scale = None

    def timers(self, num_tokens: int, block_m: int):
        """(gate_up timer, down timer): each takes a tile config and returns ms per call."""
        args, dev = self.args, self.device
        gen = torch.Generator().manual_seed(num_tokens)
        num_slots = num_tokens * args.top_k
        num_routings = 3 if num_tokens * args.top_k < args.experts else 1   # rotate only if few experts touched
        routings = [moe_align_block_size(balanced_topk_ids(num_tokens, args.experts, args.top_k, generator=gen,
                                                           device=dev), block_m, args.experts)
                    for _ in range(num_routings)]
        weights = random_topk_weights(num_tokens, args.top_k, generator=gen, device=dev).reshape(-1)
        x = torch.randn(num_tokens, args.hidden, device=dev).to(self.act_dtype)      # [M, H]
        act = torch.randn(num_slots, self.inter, device=dev).to(self.act_dtype)      # [S, I]
        x_scale = act_scale = None
        if self.use_fp8:
            x, act = x.to(FP8_DTYPE), act.to(FP8_DTYPE)
            x_scale = torch.ones(num_tokens, -(-args.hidden // 128), device=dev)
            act_scale = torch.ones(num_slots, -(-self.inter // 128), device=dev)
        act_out = torch.empty(num_slots, self.inter, dtype=self.act_dtype, device=dev)
        down_out = torch.empty(num_slots, args.hidden, dtype=self.act_dtype, device=dev)

        def gate_up(cfg: dict) -> float:
            return time_ms([lambda r=r: invoke_moe_gemm(x, self.w13, act_out, r, cfg, num_valid_slots=num_slots,
                                                        a_row_divisor=args.top_k, gated=True, a_scale=x_scale,
                                                        b_scale=self.w13_scale) for r in routings])

        def down(cfg: dict) -> float:
            return time_ms([lambda r=r: invoke_moe_gemm(act, self.w2, down_out, r, cfg, num_valid_slots=num_slots,
                                                        a_row_divisor=1, topk_weights=weights, a_scale=act_scale,
                                                        b_scale=self.w2_scale) for r in routings])
        return gate_up, down


def best_tile(timer, tiles: list[dict], deadline: float, log) -> tuple[dict | None, float]:
    best, best_ms = None, float("inf")
    for cfg in tiles:
        if time.monotonic() > deadline and best is not None:
            break
        try:
            ms = timer(cfg)
        except Exception as exc:  # noqa: BLE001 - out of resources / compile failure: skip the tile
            log(f"    skip {cfg}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        if ms < best_ms:
            best, best_ms = cfg, ms
    return best, best_ms


def tune_m(problem: Problem, num_tokens: int, deadline: float, log) -> tuple[dict | None, float]:
    args = problem.args
    act_bytes = torch.tensor([], dtype=problem.act_dtype).element_size()
    best, best_ms = None, float("inf")
    for block_m in block_m_candidates(num_tokens, args.experts, args.top_k):
        gate_up_timer, down_timer = problem.timers(num_tokens, block_m)
        up_cfg, up_ms = best_tile(gate_up_timer, tile_candidates(block_m, True, problem.use_fp8, act_bytes),
                                  deadline, log)
        down_cfg, down_ms = best_tile(down_timer, tile_candidates(block_m, False, problem.use_fp8, act_bytes),
                                      deadline, log)
        if up_cfg is None or down_cfg is None:
            continue
        log(f"  M={num_tokens} BM={block_m}: gate_up {up_ms:.4f} ms {up_cfg}, down {down_ms:.4f} ms {down_cfg}")
        if up_ms + down_ms < best_ms:
            best = dict(up_cfg)
            best["down"] = {key: down_cfg[key] for key in TILE_KEYS}
            best_ms = up_ms + down_ms
    return best, best_ms


def time_config(problem: Problem, num_tokens: int, config: dict) -> float:
    """ms of one gate_up + down pair under `config` (as fused_moe would clamp it)."""
    act_bytes = torch.tensor([], dtype=problem.act_dtype).element_size()
    w_bytes = 1 if problem.use_fp8 else act_bytes
    up_cfg, down_cfg = split_config(config)
    up_cfg = fit_config(up_cfg, 1 if problem.use_fp8 else act_bytes, w_bytes, True, problem.use_fp8)
    down_cfg = fit_config(down_cfg, 1 if problem.use_fp8 else act_bytes, w_bytes, False, problem.use_fp8)
    gate_up_timer, down_timer = problem.timers(num_tokens, up_cfg["BLOCK_SIZE_M"])
    return gate_up_timer(up_cfg) + down_timer(down_cfg)


def gemm_tflops(args: argparse.Namespace, inter: int, num_tokens: int, ms: float) -> float:
    """Achieved TFLOP/s of both GEMMs (2 * M * K * (2I * H + H * I) FLOPs)."""
    return 2 * num_tokens * args.top_k * 3 * inter * args.hidden / (ms * 1e-3) / 1e12


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--inter", type=int, nargs="+", default=[2048, 256], help="I per shard, one table each")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--m", type=int, nargs="+", default=None, help="M values (default: 1..4096)")
    parser.add_argument("--budget-s", type=float, default=240.0, help="deadline for the whole run")
    parser.add_argument("--out-dir", type=Path, default=CONFIG_DIR)
    parser.add_argument("--quick", action="store_true", help="tiny shape, two M: a smoke run (CPU is fine)")
    parser.add_argument("--report", type=Path, default=None,
                        help="CSV: per M the tuned config's time next to the untuned heuristic's")
    args = parser.parse_args(argv)
    if args.quick:
        args.experts, args.hidden, args.top_k, args.inter = 8, 64, 2, [32]
        args.m = args.m or [1, 16]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    m_values = [m for m in VISIT_ORDER if m in (args.m or M_VALUES)] + \
        [m for m in (args.m or ()) if m not in VISIT_ORDER]
    start = time.monotonic()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    report_rows: list[dict] = []
    for shape_index, inter in enumerate(args.inter):
        shape_deadline = start + args.budget_s * (shape_index + 1) / len(args.inter)
        problem = Problem(args, inter, device)
        table: dict[int, dict] = {}
        bar = tqdm(m_values, desc=f"E={args.experts} N={inter} {args.dtype}")
        for num_tokens in bar:
            if time.monotonic() > shape_deadline and table:
                bar.write(f"  budget reached: M={num_tokens} left to the nearest tuned entry")
                continue
            cfg, ms = tune_m(problem, num_tokens, shape_deadline, bar.write)
            if cfg is not None:
                table[num_tokens] = cfg
                bar.set_postfix_str(f"M={num_tokens} {ms:.4f} ms BM={cfg['BLOCK_SIZE_M']}")
                if args.report is not None:
                    untuned_ms = time_config(problem, num_tokens,
                                             default_config(num_tokens, args.experts, args.top_k, args.dtype))
                    report_rows.append({"experts": args.experts, "hidden": args.hidden, "top_k": args.top_k,
                                        "inter": inter, "dtype": args.dtype, "M": num_tokens,
                                        "untuned_ms": round(untuned_ms, 5), "tuned_ms": round(ms, 5),
                                        "speedup": round(untuned_ms / ms, 3),
                                        "tuned_tflops": round(gemm_tflops(args, inter, num_tokens, ms), 1)})
        path = args.out_dir / config_file_name(args.experts, inter, device_name(), args.dtype)
        path.write_text(json.dumps({str(m): table[m] for m in sorted(table)}, indent=2) + "\n")
        print(f"wrote {path} ({len(table)} M values, {time.monotonic() - start:.0f} s elapsed)")
        del problem
        if device == "cuda":
            torch.cuda.empty_cache()
    if args.report is not None and report_rows:
        import csv

        args.report.parent.mkdir(parents=True, exist_ok=True)
        new_file = not args.report.exists()
        with args.report.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(report_rows[0]))
            if new_file:
                writer.writeheader()
            writer.writerows(report_rows)
        print(f"wrote {args.report}")


if __name__ == "__main__":
    main()
