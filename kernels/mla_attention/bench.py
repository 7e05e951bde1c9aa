"""Benchmark MLA decode on one GPU: FlashInfer, Triton (default config and a block-size sweep), torch ref.

Legend: B = batch (sequences), N = heads, L = KV length, C = kv_lora_rank (512), R = rope dim (64).
Every sequence's L latent rows sit at random, non-contiguous slots of a bf16 pool [S, C + R].
Bytes moved = B*L*(C+R)*2 (KV) + B*N*(C+R)*2 (q) + B*N*C*2 (out); bandwidth is compared with the measured
device-to-device copy rate (4.24e12 B/s on H200) and times with SGLang's published H200 numbers.
Each timed call follows an L2 flush (so KV comes from HBM); the median of the calls is reported.

    python -m kernels.mla_attention.bench [--quick] [--out experiments/results/h200/mla_decode.csv]
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import traceback

import torch
import triton

from kernels.event_timing import median_event_ms

from kernels.mla_attention.ref import mla_decode_ref
from kernels.mla_attention.triton_decode import (
    MLADecodeConfig, default_config, default_num_kv_splits, mla_decode_triton,
)

COPY_BW_BYTES_S = 4.24e12
LATENT_DIM, ROPE_DIM = 512, 64
# SGLang's MLA decode on H200, bf16 KV: (heads, batch, kv_len) -> ms
SGLANG_MS = {(128, 64, 4096): 0.134, (128, 256, 4096): 0.504, (16, 64, 4096): 0.091, (16, 256, 4096): 0.300}
TRITON_SWEEP = [
    MLADecodeConfig(block_h=16, block_n=64, num_warps=4, num_stages=2),
    MLADecodeConfig(block_h=32, block_n=32, num_warps=8, num_stages=2),
    MLADecodeConfig(block_h=64, block_n=32, num_warps=8, num_stages=1),
    MLADecodeConfig(block_h=16, block_n=16, num_warps=4, num_stages=3),
]
FIELDS = ["impl", "heads", "batch", "kv_len", "ms", "gbps", "frac_of_copy_bw", "sglang_ms", "ratio_sglang"]


def decode_bytes(batch: int, kv_len: int, heads: int) -> int:
    kv = batch * kv_len * (LATENT_DIM + ROPE_DIM) * 2
    return kv + batch * heads * (LATENT_DIM + ROPE_DIM) * 2 + batch * heads * LATENT_DIM * 2


def make_inputs(batch: int, kv_len: int, heads: int, seed: int = 0, device: str = "cuda"):
    gen = torch.Generator(device=device).manual_seed(seed)
    num_slots = batch * kv_len + 1024
    kv_cache = torch.randn(num_slots, LATENT_DIM + ROPE_DIM, device=device, dtype=torch.bfloat16, generator=gen)
    kv_indices = torch.randperm(num_slots, device=device, generator=gen)[: batch * kv_len].to(torch.int32)
    kv_indptr = torch.arange(batch + 1, dtype=torch.int32, device=device) * kv_len
    q_nope = torch.randn(batch, heads, LATENT_DIM, device=device, dtype=torch.bfloat16, generator=gen)
    q_rope = torch.randn(batch, heads, ROPE_DIM, device=device, dtype=torch.bfloat16, generator=gen)
    return q_nope, q_rope, kv_cache, kv_indptr, kv_indices


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def row(impl: str, heads: int, batch: int, kv_len: int, ms: float) -> dict:
    gbps = decode_bytes(batch, kv_len, heads) / (ms * 1e-3) / 1e9
    sglang = SGLANG_MS.get((heads, batch, kv_len))
    return {"impl": impl, "heads": heads, "batch": batch, "kv_len": kv_len, "ms": round(ms, 5),
            "gbps": round(gbps, 1), "frac_of_copy_bw": round(gbps * 1e9 / COPY_BW_BYTES_S, 3),
            "sglang_ms": sglang if sglang is not None else "",
            "ratio_sglang": round(ms / sglang, 3) if sglang else ""}


def bench_case(batch, kv_len, heads, iters, sweep, flush, mla, device="cuda", triton_too=True) -> list[dict]:
    """mla: {impl name: FlashInferMLA} (one per FlashInfer backend asked for), or None."""
    rows = []
    sm_scale = 1 / (128 + ROPE_DIM) ** 0.5
    q_nope, q_rope, kv_cache, kv_indptr, kv_indices = make_inputs(batch, kv_len, heads, device=device)
    outputs = {}

    def attempt(impl, fn):
        try:
            outputs[impl] = fn()
            rows.append(row(impl, heads, batch, kv_len, median_event_ms(fn, iters, flush)))
        except Exception as exc:   # one failing implementation must not stop the sweep
            print(f"  {impl}: FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
            traceback.print_exc(limit=2, file=sys.stderr)

    for impl, wrapper in (mla or {}).items():
        lens = torch.full((batch,), kv_len, dtype=torch.int32)
        try:
            wrapper.plan(torch.arange(batch + 1, dtype=torch.int32), torch.arange(batch + 1, dtype=torch.int32) * kv_len,
                         kv_indices, lens, heads, LATENT_DIM, ROPE_DIM, sm_scale, torch.bfloat16, torch.bfloat16)
            attempt(impl, lambda w=wrapper: w.run(q_nope, q_rope, kv_cache))
        except Exception as exc:
            print(f"  {impl} plan FAILED: {exc!r}"[:300], file=sys.stderr)
    cfg = default_config(heads, LATENT_DIM)
    if triton_too:
        attempt("triton", lambda: mla_decode_triton(q_nope, q_rope, kv_cache, kv_indptr, kv_indices, sm_scale))
    if sweep:
        for c in TRITON_SWEEP:
            name = f"triton[h{c.block_h},n{c.block_n},w{c.num_warps},s{c.num_stages}]"
            attempt(name, lambda c=c: mla_decode_triton(q_nope, q_rope, kv_cache, kv_indptr, kv_indices,
                                                        sm_scale, config=c))
        base = default_num_kv_splits(batch, triton.cdiv(heads, cfg.block_h), q_nope.device)
        for splits in sorted({max(1, base // 2), base * 2} - {base}):   # the split heuristic, both sides
            attempt(f"triton[splits={splits}]", lambda s=splits: mla_decode_triton(
                q_nope, q_rope, kv_cache, kv_indptr, kv_indices, sm_scale, num_kv_splits=s))
    if batch * kv_len <= 8 * 4096:
        attempt("torch_ref", lambda: mla_decode_ref(q_nope, q_rope, kv_cache, kv_indptr, kv_indices, sm_scale))
    reference = outputs.get("flashinfer", outputs.get("torch_ref"))
    if reference is not None:
        errs = {k: f"{rel_err(v, reference):.1e}" for k, v in outputs.items()}
        print(f"  rel err vs {'flashinfer' if 'flashinfer' in outputs else 'torch_ref'}: {errs} (default cfg {cfg})")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/results/h200/mla_decode.csv")
    parser.add_argument("--quick", action="store_true", help="4 cases, fewer iterations, no sweep")
    parser.add_argument("--no-sweep", action="store_true", help="skip the Triton block-size sweep")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--backends", nargs="+", default=["auto"],
                        help="FlashInfer MLA backends to time (auto: fa3 on Hopper; fa2); rows 'flashinfer[<b>]'")
    parser.add_argument("--batches", type=int, nargs="+", default=None)
    parser.add_argument("--kv-lens", type=int, nargs="+", default=None)
    parser.add_argument("--heads", type=int, nargs="+", default=None)
    parser.add_argument("--no-triton", action="store_true", help="FlashInfer only")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench needs a CUDA GPU")
    batches, kv_lens, heads_list = ([1, 64], [4096], [16, 128]) if args.quick else \
        ([1, 8, 64, 256], [1024, 4096], [16, 128])
    batches, kv_lens, heads_list = args.batches or batches, args.kv_lens or kv_lens, args.heads or heads_list
    iters = args.iters or (10 if args.quick else 30)
    sweep = not (args.quick or args.no_sweep or args.no_triton)
    mla = {}
    try:
        from kernels.mla_attention.flashinfer_mla import FlashInferMLA
        for backend in args.backends:
            mla["flashinfer" if backend == "auto" else f"flashinfer[{backend}]"] = FlashInferMLA("cuda", backend=backend)
    except Exception as exc:
        print(f"flashinfer unavailable: {exc!r}", file=sys.stderr)
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")   # > H200's 60 MB L2
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    rows = []
    for heads in heads_list:
        for kv_len in kv_lens:
            for batch in batches:
                print(f"case heads={heads} batch={batch} kv_len={kv_len}", flush=True)
                rows += bench_case(batch, kv_len, heads, iters, sweep, flush, mla, triton_too=not args.no_triton)
                torch.cuda.empty_cache()
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print_table(rows)
    print(f"wrote {args.out}")


def print_table(rows: list[dict]) -> None:
    """Best Triton config next to FlashInfer and the default Triton, per case."""
    cases = sorted({(r["heads"], r["batch"], r["kv_len"]) for r in rows})
    print(f"\n{'N':>4} {'B':>4} {'L':>5} | {'flashinfer ms':>13} {'frac':>5} {'x sgl':>6} | "
          f"{'triton ms':>9} {'frac':>5} | {'best triton':<28} {'ms':>8} {'frac':>5}")
    for heads, batch, kv_len in cases:
        here = [r for r in rows if (r["heads"], r["batch"], r["kv_len"]) == (heads, batch, kv_len)]
        by_impl = {r["impl"]: r for r in here}
        fi, tr = by_impl.get("flashinfer"), by_impl.get("triton")
        tritons = [r for r in here if r["impl"].startswith("triton")]
        best = min(tritons, key=lambda r: r["ms"]) if tritons else None
        fmt = lambda r, k: f"{r[k]}" if r else "-"   # noqa: E731
        print(f"{heads:>4} {batch:>4} {kv_len:>5} | {fmt(fi, 'ms'):>13} {fmt(fi, 'frac_of_copy_bw'):>5} "
              f"{fmt(fi, 'ratio_sglang') if fi else '-':>6} | {fmt(tr, 'ms'):>9} {fmt(tr, 'frac_of_copy_bw'):>5} | "
              f"{best['impl'] if best else '-':<28} {fmt(best, 'ms'):>8} {fmt(best, 'frac_of_copy_bw'):>5}"
              + "".join(f" | {r['impl']} {r['ms']}" for r in here if r["impl"].startswith("flashinfer[")))


if __name__ == "__main__":
    main()
