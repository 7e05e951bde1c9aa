"""The sizes the runtime captures CUDA graphs for -- decode batch sizes (SGLang's grid) and piecewise-graph
token counts of extend steps -- shared by the runtime (which captures them) and the simulator's cost models
(which price the padding and the launches). Pure functions; imports neither torch nor a clock."""
from __future__ import annotations

import bisect

# Largest step captured as piecewise graphs unless configured (capped by the prefill chunk, so that by default
# every extend step of a chunk replays graphs). SGLang's --piecewise-cuda-graph-max-tokens plays the same role.
# Past ~2,048 new tokens a step is GPU-bound on an H200 with fast host launches, and eager launches cost it
# nothing when warm; but an eager step of a token count the process has not served before pays the GEMM
# library's per-shape set-up (4-17 ms on DeepSeek-V2-Lite), served traffic is mostly such counts, and on
# machines with slow launches an eager step is host-bound (60 ms of launch for 28 ms of kernels). Graphs
# replay every count the same way from the first step on.
PIECEWISE_DEFAULT_MAX_TOKENS = 8192


def capture_batch_sizes(max_bs: int) -> list[int]:
    """SGLang's decode capture grid: 1, 2, 4, 8, 12, 16, 24, 32, ... every 8 up to 256, then every 16, up to
    max_bs (max_bs itself always included)."""
    if max_bs < 1:
        raise ValueError(f"cuda_graph_max_bs must be >= 1, got {max_bs}")
    grid = [1, 2, 4, 8, 12, 16] + list(range(24, 257, 8)) + list(range(272, max_bs + 1, 16))
    return sorted({bs for bs in grid if bs <= max_bs} | {max_bs})


def extend_token_buckets(max_tokens: int) -> list[int]:
    """Piecewise-graph token counts up to max_tokens (itself included): 4..32 step 4, 48..256 step 16, then
    8 sizes per doubling up to 2,048 (steps of 32, 64, 128), 16 per doubling above (steps of 128, 256, ...).
    Padding adds at most 15 tokens below 256 (where a step's time follows its weight reads, not its token
    count), at most 1/8 of a step's tokens up to 2,048 and 1/16 above, where steps are GPU-bound and the
    padding's work is paid in full."""
    if max_tokens < 1:
        raise ValueError(f"piecewise_cuda_graph_max_tokens must be >= 1, got {max_tokens}")
    grid = list(range(4, 33, 4)) + list(range(48, 257, 16))
    low, step = 256, 32
    while low < max_tokens:
        grid += list(range(low + step, 2 * low + 1, step))
        low = 2 * low
        step = 2 * step if low < 2048 else low // 16
    return sorted({t for t in grid if t <= max_tokens} | {max_tokens})


def padded_size(size: int, grid: list[int]) -> int | None:
    """The smallest captured size >= size (grid sorted ascending); None if it exceeds them all."""
    i = bisect.bisect_left(grid, size)
    return grid[i] if i < len(grid) else None
