"""Compile every fused MoE kernel variant for sm_90 without a GPU (Triton's bundled ptxas) and report
shared memory, registers and spills: catches compile errors and oversize tiles on a CPU-only machine.

Legend: BM/BN/BK = block sizes, w = warps, s = pipeline stages. Uses Triton internals (ASTSource with
a signature dict and divisibility attrs), checked with triton 3.9; the GPU path itself does not use it.
Specialisations mimic DeepSeek-V3 shapes (every integer divisible by 16, unit inner strides, K = 8).

  python -m kernels.fused_moe.compile_check            # all tuner tiles + defaults + fp8 + helpers
  python -m kernels.fused_moe.compile_check --quick    # one tile per kind
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.small_ops.triton_act import _silu_and_mul_kernel
from kernels.fused_moe.align import _align_count_kernel, _align_prefix_kernel, _align_scatter_kernel
from kernels.fused_moe.combine import _topk_sum_kernel
from kernels.fused_moe.config import FP8_GROUP, default_config, fit_config, split_config
from kernels.fused_moe.gemm import _moe_gemm_kernel
from kernels.fused_moe.quant import _per_token_group_quant_kernel
from kernels.fused_moe.tune import tile_candidates

TARGET = GPUTarget("cuda", 90, 32)
SMEM_LIMIT_BYTES = 232448          # H100/H200 opt-in shared memory per CTA
GEMM_INTS = ("size_n size_d em num_valid_slots up_row_offset stride_am stride_ad stride_be stride_bn stride_bd "
             "stride_cm stride_cn stride_asm stride_asd stride_bse stride_bsn stride_bsd").split()
UNIT_STRIDES = {"stride_ad": 1, "stride_bd": 1, "stride_cn": 1}


def compile_kernel(fn, types: dict, constexprs: dict, num_warps: int, num_stages: int = 3):
    signature = {name: "constexpr" if name in constexprs else types[name] for name in fn.arg_names}
    divisible = [n for n, t in types.items() if n not in constexprs and n not in ("em", "num_valid_slots")]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    source = ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages})


def compile_gemm(cfg: dict, *, gated: bool, down: bool, dtype: str = "bf16", fp8: bool = False):
    elt = "fp8e4nv" if fp8 else dtype
    types = {"a_ptr": "*" + elt, "b_ptr": "*" + elt, "c_ptr": "*" + dtype,
             "a_scale_ptr": "*fp32" if fp8 else "*" + elt, "b_scale_ptr": "*fp32" if fp8 else "*" + elt,
             "topk_weights_ptr": "*fp32" if down else "*" + elt, "sorted_token_ids_ptr": "*i32",
             "expert_ids_ptr": "*i32", "num_tokens_post_padded_ptr": "*i32"}
    types.update({name: "i32" for name in GEMM_INTS})
    constexprs = dict(UNIT_STRIDES, BLOCK_SIZE_M=cfg["BLOCK_SIZE_M"], BLOCK_SIZE_N=cfg["BLOCK_SIZE_N"],
                      BLOCK_SIZE_K=cfg["BLOCK_SIZE_K"], GROUP_SIZE_M=cfg["GROUP_SIZE_M"],
                      A_ROW_DIVISOR=1 if down else 8, GATED=gated, MUL_ROUTED_WEIGHT=down, USE_FP8=fp8,
                      EVEN_D=True, DOT_IEEE=dtype == "fp32", QUANT_GROUP=FP8_GROUP)
    return compile_kernel(_moe_gemm_kernel, types, constexprs, cfg["num_warps"], cfg["num_stages"])


def resource_usage(kernel) -> str:
    """'REG:.. STACK:..' from cuobjdump, or '' when the tool is missing."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(kernel.asm["cubin"])
        file.flush()
        text = subprocess.run([str(tool), "-res-usage", file.name], capture_output=True, text=True).stdout
    match = re.search(r"REG:(\d+) STACK:(\d+)", text)
    return f"regs {match.group(1)} stack {match.group(2)}" if match else ""


def gemm_cases(quick: bool) -> list[tuple[str, dict, dict]]:
    """(label, config, compile kwargs) for tuner tiles, default configs and fp8/fp32 variants."""
    cases = []
    for block_m in (16, 32, 64, 128):
        for gated in (True, False):
            tiles = tile_candidates(block_m, gated, False, 2)
            for cfg in tiles[:1] if quick else tiles:
                cases.append(("gate_up" if gated else "down", cfg, {"gated": gated, "down": not gated}))
    for num_tokens in (1, 512, 4096):
        for dtype, elt, fp8 in (("bf16", 2, False), ("fp32", 4, False), ("fp8_w8a8", 1, True)):
            gate_up, down = split_config(default_config(num_tokens, 256, 8, dtype))
            kind = {"dtype": "fp32" if dtype == "fp32" else "bf16", "fp8": fp8}
            cases.append((f"default {dtype} M={num_tokens} gate_up", fit_config(gate_up, elt, elt, True, fp8),
                          dict(kind, gated=True, down=False)))
            cases.append((f"default {dtype} M={num_tokens} down", fit_config(down, elt, elt, False, fp8),
                          dict(kind, gated=False, down=True)))
    return cases


def helper_kernels() -> list[tuple[str, object]]:
    i32 = "i32"
    return [
        ("align count", lambda: compile_kernel(_align_count_kernel, {
            "topk_ids_ptr": "*i32", "partial_ptr": "*i32", "sorted_ptr": "*i32", "num_slots": i32,
            "capacity": i32, "chunk_len": i32, "fill_len": i32}, {"E_POW2": 256, "SUB": 64, "FILL": 1024}, 4)),
        ("align prefix", lambda: compile_kernel(_align_prefix_kernel, {
            "partial_ptr": "*i32", "base_ptr": "*i32", "expert_ids_ptr": "*i32", "num_post_ptr": "*i32",
            "num_programs": i32, "num_blocks": i32},
            {"BLOCK_SIZE_M": 16, "E_POW2": 256, "P_POW2": 64, "BLOCKS": 64}, 8)),
        ("align scatter", lambda: compile_kernel(_align_scatter_kernel, {
            "topk_ids_ptr": "*i64", "base_ptr": "*i32", "sorted_ptr": "*i32", "num_slots": i32,
            "chunk_len": i32}, {"E_POW2": 256, "SUB": 64}, 4)),
        ("topk sum", lambda: compile_kernel(_topk_sum_kernel, {
            "rows_ptr": "*bf16", "ids_ptr": "*i32", "out_ptr": "*bf16", "size_h": i32, "stride_rm": i32,
            "stride_om": i32, "stride_it": i32, "stride_ik": i32}, {"TOP_K": 8, "BLOCK_H": 1024}, 4)),
        ("quant fp8", lambda: compile_kernel(_per_token_group_quant_kernel, {
            "x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "size_d": i32, "num_groups": i32,
            "stride_xm": i32, "stride_qm": i32, "stride_sm": i32},
            {"GROUP": 128, "QMAX": 448.0, "FLOOR": 1e-10}, 1)),
        ("silu_and_mul", lambda: compile_kernel(_silu_and_mul_kernel, {
            "x_ptr": "*bf16", "out_ptr": "*bf16", "stride_x": i32, "stride_out": i32, "inter": i32},
            {"BLOCK": 1024}, 4)),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    problems = 0
    start = time.monotonic()
    jobs = [(f"{label} {cfg}", lambda cfg=cfg, kw=kw: compile_gemm(cfg, **kw))
            for label, cfg, kw in gemm_cases(args.quick)]
    for label, build in jobs + helper_kernels():
        try:
            kernel = build()
        except Exception as exc:  # noqa: BLE001 - report every failure, keep going
            problems += 1
            print(f"FAIL {label}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
            continue
        smem, usage = kernel.metadata.shared, resource_usage(kernel)
        spills = re.search(r"stack [1-9]", usage) is not None
        bad = smem > SMEM_LIMIT_BYTES or (spills and label.startswith("default"))
        problems += bad   # a spilling tuner tile is only slow: the tuner times it and passes it over
        print(f"{'BAD ' if bad else 'WARN' if spills else 'ok  '} {label}: smem {smem} {usage}", flush=True)
    print(f"{len(jobs) + len(helper_kernels())} kernels, {problems} problems, {time.monotonic() - start:.0f} s")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
