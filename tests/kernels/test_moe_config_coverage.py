"""config_token_counts: the step sizes mode=real's warm-up runs so that every fused-MoE launch config a
serving run can pick is compiled before the first request (a config first met mid-run cost ~0.5 s)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from kernels.fused_moe.config import config_file_name, config_token_counts, get_config  # noqa: E402

E, K, N = 64, 6, 1408


def _key(m: int, table_dir, dtype: str = "bf16") -> str:
    return json.dumps(get_config(m, E, K, N, dtype, "GPU", table_dir), sort_keys=True)


def _write_table(table_dir, keys: list[int]) -> None:
    table = {str(m): {"BLOCK_SIZE_M": 16 if m < 64 else 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64 + i,
                      "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3} for i, m in enumerate(keys)}
    (table_dir / config_file_name(E, N, "GPU", "bf16")).write_text(json.dumps(table))


@pytest.mark.parametrize("max_tokens", [1, 100, 3000, 3500, 8192])
def test_every_config_up_to_the_limit_has_one_representative(tmp_path, max_tokens):
    _write_table(tmp_path, [1, 8, 64, 512, 2048, 4096, 8192])
    counts = config_token_counts(E, K, N, "bf16", max_tokens, "GPU", tmp_path)
    assert counts == sorted(counts) and all(1 <= m <= max_tokens for m in counts)
    represented = {_key(m, tmp_path) for m in counts}
    assert len(represented) == len(counts)                       # one size per config, no repeats
    met = {_key(m, tmp_path) for m in range(1, max_tokens + 1)}
    assert met == represented                                    # every config a step can pick is warmed


def test_a_limit_between_keys_warms_the_upper_keys_config(tmp_path):
    # 3500 is nearer to 4096 than to 2048: its steps use 4096's config, which no key <= 3500 has
    _write_table(tmp_path, [1, 2048, 4096])
    counts = config_token_counts(E, K, N, "bf16", 3500, "GPU", tmp_path)
    assert _key(4096, tmp_path) in {_key(m, tmp_path) for m in counts}


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_without_a_table_the_heuristics_thresholds_are_covered(tmp_path, dtype):
    counts = config_token_counts(E, K, N, dtype, 8192, "GPU", tmp_path)
    met = {_key(m, tmp_path, dtype) for m in range(1, 8193)}
    assert {_key(m, tmp_path, dtype) for m in counts} == met and len(counts) == len(met) > 1
