"""SiLU-and-mul with a per-token sigmoid gate (Qwen2-MoE's shared expert) against kernels/small_ops/ref.py,
and the algebra the fused MoE relies on: scaling the activation rows equals scaling the down projection.

Without CUDA the Triton kernel runs in Triton's CPU interpreter (float32/float16 only).
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernels.small_ops.ref import silu_and_mul_gated_ref, silu_and_mul_ref  # noqa: E402
from kernels.small_ops.triton_gated_act import silu_and_mul_gated_triton  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_tokens,inter", [(1, 8), (5, 48), (3, 1500)])
def test_gated_silu_and_mul_matches_ref(dtype, num_tokens, inter) -> None:
    gen = torch.Generator().manual_seed(inter)
    gate_up = torch.randn(num_tokens, 2 * inter, generator=gen).to(dtype).to(DEVICE)
    logits = torch.randn(num_tokens, 7, generator=gen).to(DEVICE)          # gate logit = column 6 (strided)
    out = silu_and_mul_gated_triton(gate_up, logits[:, 6:])
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out, silu_and_mul_gated_ref(gate_up, logits[:, 6:]), rtol=tol, atol=tol)


def test_gate_before_down_equals_gate_after_down() -> None:
    gen = torch.Generator().manual_seed(0)
    gate_up, logit = torch.randn(4, 32, generator=gen), torch.randn(4, 1, generator=gen)
    down = torch.randn(10, 16, generator=gen)                               # [H, I]
    before = silu_and_mul_gated_ref(gate_up, logit) @ down.t()
    after = torch.sigmoid(logit) * (silu_and_mul_ref(gate_up) @ down.t())
    torch.testing.assert_close(before, after, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(before, silu_and_mul_ref(gate_up) @ down.t())   # the gate matters
