"""Launch configs for the fused MoE GEMMs: tuned JSON tables (SGLang's file naming) or a shape heuristic.

Legend: M = tokens, E = experts, K = top-k, I = intermediate size per shard (SGLang's "N" in file
names), BM/BN/BK = block sizes. A config is SGLang's dict {BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K,
GROUP_SIZE_M, num_warps, num_stages} for the gate_up GEMM, plus an optional "down" dict overriding all
keys but BLOCK_SIZE_M for the down GEMM (both GEMMs share one token alignment, hence one BM).
A table file maps M (as a string) to a config; the entry with the nearest M is used.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

CONFIG_DIR = Path(__file__).parent / "configs"
SHARED_MEMORY_BYTES = 200 * 1024  # H100/H200 allow 227 KiB per CTA; keep room for the epilogue
FP8_GROUP = 128                    # block-scaled fp8: 128x128 weight blocks, 1x128 activation groups
TILE_KEYS = ("BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def dtype_name(weight_dtype: torch.dtype) -> str:
    if weight_dtype == getattr(torch, "float8_e4m3fn", None):
        return "fp8_w8a8"
    return _DTYPE_NAMES[weight_dtype]


def device_name() -> str:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return name.replace(" ", "_")


def config_file_name(num_experts: int, inter_size: int, device: str, dtype: str) -> str:
    return f"E={num_experts},N={inter_size},device_name={device},dtype={dtype}.json"


@functools.lru_cache(maxsize=None)
def _load_table(path: str) -> dict[int, dict] | None:
    """M -> config from one JSON file; None if the file does not exist. Pure function of the path."""
    file = Path(path)
    if not file.is_file():
        return None
    return {int(m): cfg for m, cfg in json.loads(file.read_text()).items()}


def default_config(num_tokens: int, num_experts: int, top_k: int, dtype: str = "bf16") -> dict:
    """Heuristic when no table exists: BM follows the expected tokens per expert (M*K/E). The gated
    gate_up tile keeps two accumulators, so its BN is half the down tile's (<= 64 fp32 values a thread;
    compile_check.py shows 128x128 gated tiles spilling in fp8 and fp32)."""
    tokens_per_expert = num_tokens * top_k / max(num_experts, 1)
    if tokens_per_expert <= 16:   # decode: stream weights, many CTAs along N
        return {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                "num_warps": 4, "num_stages": 4}
    if dtype == "fp32":           # correctness path: small tiles, fp32 operands are register-hungry
        return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8,
                "num_warps": 8, "num_stages": 3}
    block_m = 64 if tokens_per_expert <= 64 else 128
    return {"BLOCK_SIZE_M": block_m, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128 if dtype == "fp8_w8a8" else 64,
            "GROUP_SIZE_M": 8, "num_warps": 8, "num_stages": 3,
            "down": {"BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128 if dtype == "fp8_w8a8" else 64}}


def get_config(num_tokens: int, num_experts: int, top_k: int, inter_size: int, dtype: str,
               device: str | None = None, config_dir: Path = CONFIG_DIR) -> dict:
    """The tuned config of the nearest M from the matching table, else default_config. Returns a copy."""
    file = Path(config_dir) / config_file_name(num_experts, inter_size, device or device_name(), dtype)
    table = _load_table(str(file))
    if not table:
        return default_config(num_tokens, num_experts, top_k, dtype)
    nearest = min(table, key=lambda m: (abs(m - num_tokens), m))
    return json.loads(json.dumps(table[nearest]))


def config_token_counts(num_experts: int, top_k: int, inter_size: int, dtype: str, max_tokens: int,
                        device: str | None = None, config_dir: Path = CONFIG_DIR) -> list[int]:
    """One token count M <= max_tokens per distinct config get_config picks for 1..max_tokens, ascending:
    running each once compiles every Triton specialisation a serving run can meet. Candidates: the table's
    keys (every M picks its nearest key's config), max_tokens (its nearest key may lie above it), and the
    heuristic's thresholds."""
    per_expert = max(num_experts, 1) / max(top_k, 1)
    candidates = {1, max_tokens, int(16 * per_expert), int(16 * per_expert) + 1,
                  int(64 * per_expert), int(64 * per_expert) + 1}
    file = Path(config_dir) / config_file_name(num_experts, inter_size, device or device_name(), dtype)
    candidates.update(_load_table(str(file)) or {})   # M in a key's region picks the key's config
    seen: dict[str, int] = {}
    for m in sorted(c for c in candidates if 1 <= c <= max_tokens):
        cfg = get_config(m, num_experts, top_k, inter_size, dtype, device, config_dir)
        seen.setdefault(json.dumps(cfg, sort_keys=True), m)
    return sorted(seen.values())


def shared_memory_bytes(cfg: dict, a_bytes: int, b_bytes: int, gated: bool) -> int:
    """Pipeline buffers of one CTA: num_stages x (A tile + one or two B tiles)."""
    a_tile = cfg["BLOCK_SIZE_M"] * cfg["BLOCK_SIZE_K"] * a_bytes
    b_tile = cfg["BLOCK_SIZE_K"] * cfg["BLOCK_SIZE_N"] * b_bytes * (2 if gated else 1)
    return cfg["num_stages"] * (a_tile + b_tile)


def fit_config(cfg: dict, a_bytes: int, b_bytes: int, gated: bool, use_fp8: bool) -> dict:
    """Clamp a config to what the kernel accepts: BK within one fp8 scale group, shared memory that fits."""
    cfg = dict(cfg)
    if use_fp8:  # a K tile must not straddle two scale groups; fp8 MMA needs K >= 32
        cfg["BLOCK_SIZE_K"] = min(max(cfg["BLOCK_SIZE_K"], 32), FP8_GROUP)
    while shared_memory_bytes(cfg, a_bytes, b_bytes, gated) > SHARED_MEMORY_BYTES:
        if cfg["num_stages"] > 2:
            cfg["num_stages"] -= 1
        elif cfg["BLOCK_SIZE_K"] > 32:
            cfg["BLOCK_SIZE_K"] //= 2
        else:
            cfg["BLOCK_SIZE_N"] //= 2
    return cfg


def split_config(config: dict) -> tuple[dict, dict]:
    """(gate_up config, down config); the down one inherits every key it does not override."""
    gate_up = {key: config[key] for key in ("BLOCK_SIZE_M",) + TILE_KEYS}
    down = dict(gate_up)
    down.update({key: value for key, value in config.get("down", {}).items() if key != "BLOCK_SIZE_M"})
    return gate_up, down
