"""Benchmark the small ops on one GPU: Triton vs FlashInfer vs torch reference, DeepSeek-V3-sized rows.

Legend: T = tokens, H = hidden (7168), I = MoE intermediate (2048), N = heads (128), R = rope dim (64),
C = kv_lora_rank (512). Bytes are the minimum HBM traffic of each op; bandwidth is compared with the
measured device-to-device copy rate (4.24e12 B/s on H200). Each timed call follows an L2 flush.

    python -m kernels.small_ops.bench [--quick] [--out experiments/results/h200/small_ops.csv]
"""
from __future__ import annotations

import argparse
import csv
import os
import sys

import torch

from kernels.event_timing import median_event_ms

from kernels.small_ops import ref
from kernels.small_ops.rope_cache import deepseek_yarn_cos_sin_cache
from kernels.small_ops.triton_act import silu_and_mul_triton
from kernels.small_ops.triton_kv_store import store_mla_kv_triton
from kernels.small_ops.triton_norm import fused_add_rmsnorm_triton, rmsnorm_triton
from kernels.small_ops.triton_rope import rope_triton

COPY_BW_BYTES_S = 4.24e12
HIDDEN, INTER, HEADS, ROPE_DIM, LATENT_DIM, NUM_SLOTS = 7168, 2048, 128, 64, 512, 1 << 20
FIELDS = ["op", "impl", "tokens", "width", "us", "gbps", "frac_of_copy_bw"]


def op_cases(tokens: int, cache: torch.Tensor, pool: torch.Tensor, device: str = "cuda"):
    """(op, width, bytes, {impl: fn}) for one token count; FlashInfer entries only when it imports."""
    bf16 = dict(dtype=torch.bfloat16, device=device)
    x, res, w = torch.randn(tokens, HIDDEN, **bf16), torch.randn(tokens, HIDDEN, **bf16), torch.randn(HIDDEN, **bf16)
    gate_up = torch.randn(tokens, 2 * INTER, **bf16)
    q_full, k_rope = torch.randn(tokens, HEADS, 192, **bf16), torch.randn(tokens, ROPE_DIM, **bf16)
    q_rope_contig = torch.randn(tokens, HEADS, ROPE_DIM, **bf16)
    positions = torch.randint(0, cache.shape[0], (tokens,), device=device)
    c_kv = torch.randn(tokens, LATENT_DIM, **bf16)
    slots = torch.randperm(pool.shape[0], device=device)[:tokens]
    cases = [
        ("rmsnorm", HIDDEN, 2 * tokens * HIDDEN * 2, {
            "triton": lambda: rmsnorm_triton(x, w, 1e-6),
            "torch_ref": lambda: ref.rmsnorm_ref(x, w, 1e-6)}),
        ("fused_add_rmsnorm", HIDDEN, 4 * tokens * HIDDEN * 2, {
            "triton": lambda: fused_add_rmsnorm_triton(x, res, w, 1e-6),
            "torch_ref": lambda: ref.fused_add_rmsnorm_ref(x, res, w, 1e-6)}),
        ("silu_and_mul", INTER, 3 * tokens * INTER * 2, {
            "triton": lambda: silu_and_mul_triton(gate_up),
            "torch_ref": lambda: ref.silu_and_mul_ref(gate_up)}),
        ("rope_interleaved", HEADS * ROPE_DIM, 2 * tokens * (HEADS + 1) * ROPE_DIM * 2 + tokens * ROPE_DIM * 4, {
            "triton": lambda: rope_triton(positions, q_full[..., 128:], k_rope, cache, False),
            "torch_ref": lambda: ref.rope_ref(positions, q_full[..., 128:], cache, False)}),
        ("store_mla_kv", LATENT_DIM + ROPE_DIM, 2 * tokens * (LATENT_DIM + ROPE_DIM) * 2, {
            "triton": lambda: store_mla_kv_triton(pool, slots, c_kv, k_rope),
            "torch_ref": lambda: ref.store_mla_kv_ref(pool, slots, c_kv, k_rope)}),
    ]
    try:
        from kernels.small_ops import flashinfer_ops as fi
        import flashinfer  # noqa: F401
    except Exception:
        return cases
    cases[0][3]["flashinfer"] = lambda: fi.rmsnorm_flashinfer(x, w, 1e-6)
    cases[1][3]["flashinfer"] = lambda: fi.fused_add_rmsnorm_flashinfer(x, res, w, 1e-6)
    cases[2][3]["flashinfer"] = lambda: fi.silu_and_mul_flashinfer(gate_up)
    cases[3][3]["flashinfer"] = lambda: fi.rope_flashinfer(positions, q_rope_contig, k_rope, cache, False)
    return cases


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/results/h200/small_ops.csv")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench needs a CUDA GPU")
    token_counts = [1, 256] if args.quick else [1, 64, 256, 1024, 4096]
    iters = 10 if args.quick else 30
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    cache = deepseek_yarn_cos_sin_cache(ROPE_DIM, 32768, 10000.0, 40.0, 4096, mscale=1.0, mscale_all_dim=1.0).cuda()
    pool = torch.zeros(NUM_SLOTS, LATENT_DIM + ROPE_DIM, dtype=torch.bfloat16, device="cuda")
    rows = []
    for tokens in token_counts:
        for op, width, num_bytes, impls in op_cases(tokens, cache, pool):
            for impl, fn in impls.items():
                try:
                    us = median_event_ms(fn, iters, flush) * 1e3
                except Exception as exc:   # keep going: one failing impl must not stop the bench
                    print(f"{op} {impl} T={tokens}: FAILED {exc!r}"[:300], file=sys.stderr)
                    continue
                gbps = num_bytes / (us * 1e-6) / 1e9
                rows.append({"op": op, "impl": impl, "tokens": tokens, "width": width, "us": round(us, 2),
                             "gbps": round(gbps, 1), "frac_of_copy_bw": round(gbps * 1e9 / COPY_BW_BYTES_S, 3)})
                print(f"{op:>18} {impl:>10} T={tokens:>5}  {us:9.2f} us  {gbps:8.1f} GB/s")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
