"""Benchmark paged GQA attention on one GPU: FlashInfer (decode: CUDA-core and tensor-core; prefill: fa2 and
fa3 with --fa3), the Triton fallback, at Llama-3-8B (N=32, Hkv=8) and Qwen2-MoE (N=16, Hkv=16) shapes, D = 128, bf16.

Legend: B = sequences, L = KV length, T = new tokens of a prefill, P = cached prefix per sequence.
Decode: bytes = B*L*Hkv*D*2 (K and V) * 2 B + q/out; bandwidth is compared with the measured device-to-device
copy rate (4.24e12 B/s on H200). Prefill: causal FLOPs = 4*N*D * sum over new tokens of the KV they see,
compared with the measured bf16 matmul rate (7.8e14 FLOP/s on H200). KV sits at random, non-contiguous
slots (page size 1). Each timed call follows an L2 flush; the median is reported.

    python -m kernels.gqa_attention.bench [--quick] [--out experiments/results/h200/gqa_attention.csv]
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import traceback

import torch

from kernels.event_timing import median_event_ms
from kernels.gqa_attention.ref import gqa_attention_ref
from kernels.gqa_attention.triton_attention import gqa_attention_triton

COPY_BW_BYTES_S = 4.24e12
MATMUL_FLOP_S = 7.8e14
HEAD_DIM = 128
SHAPES = {"llama3_8b": (32, 8), "qwen2_moe": (16, 16)}
FIELDS = ["kind", "model", "impl", "batch", "new_tokens", "kv_len", "ms", "gbps", "tflops", "frac_of_roofline",
          "rel_err"]


def make_inputs(q_lens: list[int], kv_lens: list[int], heads: int, kv_heads: int, device: str = "cuda"):
    gen = torch.Generator(device=device).manual_seed(0)
    num_slots = sum(kv_lens) + 1024
    k = torch.randn(num_slots, kv_heads, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(num_slots, kv_heads, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=gen)
    idx = torch.randperm(num_slots, device=device, generator=gen)[:sum(kv_lens)].to(torch.int32)
    qo = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    kv = torch.tensor([0] + torch.tensor(kv_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(sum(q_lens), heads, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=gen)
    return q, k, v, qo, kv, idx


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def decode_bytes(batch: int, kv_len: int, heads: int, kv_heads: int) -> int:
    return batch * kv_len * kv_heads * HEAD_DIM * 2 * 2 + 2 * batch * heads * HEAD_DIM * 2


def prefill_flops(q_lens: list[int], kv_lens: list[int], heads: int) -> float:
    seen = sum(sum(kv - q + i + 1 for i in range(q)) for q, kv in zip(q_lens, kv_lens))
    return 4.0 * heads * HEAD_DIM * seen


def bench_case(kind: str, model: str, q_lens: list[int], kv_lens: list[int], iters: int, flush,
               prefill_backends: tuple[str, ...] = ("fa2",)) -> list[dict]:
    from kernels.gqa_attention.flashinfer_gqa import FlashInferGQA

    heads, kv_heads = SHAPES[model]
    q, k, v, qo, kv, idx = make_inputs(q_lens, kv_lens, heads, kv_heads)
    qo_d, kv_d = qo.cuda(), kv.cuda()
    scale = HEAD_DIM ** -0.5
    lens = torch.tensor(kv_lens, dtype=torch.int32)
    reference = None
    if sum(kv_lens) * max(q_lens) <= 4096 * 4096:
        reference = gqa_attention_ref(q, k, v, qo_d, kv_d, idx, scale, causal=True)
    impls = {"triton": lambda: gqa_attention_triton(q, k, v, qo_d, kv_d, idx, scale, max_q_len=max(q_lens))}
    variants = ([("flashinfer_cuda_cores", dict(decode_tensor_cores=False)),
                 ("flashinfer_tensor_cores", dict(decode_tensor_cores=True))] if kind == "decode" else
                [(f"flashinfer_{b}", dict(prefill_backend=b)) for b in prefill_backends])
    for name, kwargs in variants:
        try:
            gqa = FlashInferGQA("cuda", workspace_bytes=512 * 2**20, **kwargs)
            gqa.plan(qo, kv, idx, lens, heads, kv_heads, HEAD_DIM, scale, torch.bfloat16, torch.bfloat16, causal=True)
            impls[name] = lambda g=gqa: g.run(q, k, v)
        except Exception as exc:   # flashinfer absent or a variant not compiled here: keep going
            print(f"  {name}: plan FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
    rows = []
    for impl, fn in impls.items():
        try:
            out = fn()
            ms = median_event_ms(fn, iters, flush)
        except Exception as exc:
            print(f"  {impl}: FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
            traceback.print_exc(limit=2, file=sys.stderr)
            continue
        row = {"kind": kind, "model": model, "impl": impl, "batch": len(q_lens), "new_tokens": sum(q_lens),
               "kv_len": kv_lens[0], "ms": round(ms, 5), "gbps": "", "tflops": "",
               "rel_err": f"{rel_err(out, reference):.1e}" if reference is not None else ""}
        if kind == "decode":
            gbps = decode_bytes(len(q_lens), kv_lens[0], heads, kv_heads) / (ms * 1e-3) / 1e9
            row.update(gbps=round(gbps, 1), frac_of_roofline=round(gbps * 1e9 / COPY_BW_BYTES_S, 3))
        else:
            tflops = prefill_flops(q_lens, kv_lens, heads) / (ms * 1e-3) / 1e12
            row.update(tflops=round(tflops, 1), frac_of_roofline=round(tflops * 1e12 / MATMUL_FLOP_S, 3))
        rows.append(row)
        print(f"  {row}", flush=True)
    return rows


def cases(quick: bool) -> list[tuple[str, list[int], list[int]]]:
    """(kind, q_lens, kv_lens): decode batches over equal contexts; prefills of T new tokens in chunks of
    one sequence, with no prefix and with a 2k cached prefix."""
    out = []
    for batch in ([1, 64] if quick else [1, 8, 64, 256]):
        for kv_len in ([4096] if quick else [1024, 4096]):
            out.append(("decode", [1] * batch, [kv_len] * batch))
    for new in ([2048] if quick else [512, 2048, 8192]):
        for prefix in (0, 2048):
            out.append(("prefill", [new], [new + prefix]))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/results/h200/gqa_attention.csv")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--fa3", action="store_true", help="also time FlashInfer's fa3 prefill (long JIT build)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench needs a CUDA GPU")
    iters = args.iters or (10 if args.quick else 20)
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")   # > H200's 60 MB L2
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    rows = []
    for model in SHAPES:
        for kind, q_lens, kv_lens in cases(args.quick):
            print(f"case {model} {kind} B={len(q_lens)} T={sum(q_lens)} L={kv_lens[0]}", flush=True)
            rows += bench_case(kind, model, q_lens, kv_lens, iters, flush, ("fa2", "fa3") if args.fa3 else ("fa2",))
            torch.cuda.empty_cache()
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print_table(rows)
    print(f"wrote {args.out}")


def print_table(rows: list[dict]) -> None:
    keys = sorted({(r["model"], r["kind"], r["batch"], r["new_tokens"], r["kv_len"]) for r in rows})
    impls = sorted({r["impl"] for r in rows})
    print(f"\n{'model':<10} {'kind':<7} {'B':>4} {'T':>5} {'L':>6} | " + " | ".join(f"{i[:24]:>24}" for i in impls))
    for key in keys:
        by_impl = {r["impl"]: r for r in rows if (r["model"], r["kind"], r["batch"], r["new_tokens"], r["kv_len"]) == key}
        cells = [f"{by_impl[i]['ms']:>9} ms {by_impl[i]['frac_of_roofline']:>5}x" if i in by_impl else f"{'-':>24}"
                 for i in impls]
        print(f"{key[0]:<10} {key[1]:<7} {key[2]:>4} {key[3]:>5} {key[4]:>6} | " + " | ".join(f"{c:>24}" for c in cells))


if __name__ == "__main__":
    main()
