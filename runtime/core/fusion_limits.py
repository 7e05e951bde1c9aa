"""Token counts up to which the runtime's fast path runs its layer fusions: one rule read by the model code
(runtime.models.moe) and by the simulator's roofline (sim.costmodel.roofline_ops). Torch-free, clock-free.

Measured on an H200 at DeepSeek-V2-Lite's shapes (experiments/bench_layer_fusions.py,
experiments/results/h200/layer_fusions/): the two-launch router beats the router GEMM + softmax + top-k up
to 512 tokens (6.6 vs 21 us at 64, 21 vs 31 at 512, even at 1024); shared experts stacked into the fused MoE
beat the dense shared MLP up to 64 tokens (48 vs 55 us at one token) and lose 5-8% at 128-512.
"""
ROUTER_KERNEL_MAX_TOKENS = 512   # SmallOps.route up to this many tokens
STACKED_SHARED_MAX_TOKENS = 64   # MoE.fuse_shared_experts: stacked pairs up to this many tokens


def stacks_shared_experts(tp: int, ep: int) -> bool:
    """Whether the runtime stacks shared experts into the fused MoE: one rank only (sharded models keep them
    as a tensor-parallel MLP)."""
    return tp == 1 and ep == 1
